"""Engine adapters, one module per ``ServerConfig.engine`` kind; pick one with
:func:`harvest.server.base.adapter_for`. Adapters describe launches; they never perform them."""
