"""Command-line interface: argument parsing and rendering only. All work lives in the layers below."""
