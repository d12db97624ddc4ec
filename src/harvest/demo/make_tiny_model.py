"""Build a tiny random-weight Llama model with a locally trained BPE tokenizer. No hub access.

Run with the Python of an engine environment (it needs torch, transformers and tokenizers; the
GGUF file for llama.cpp also needs the ``gguf`` package):

    python make_tiny_model.py OUT_DIR [--size tiny|100m|1b] [--gguf]

Writes a Hugging Face model folder (config, safetensors weights, tokenizer with a chat template)
and, with ``--gguf``, ``OUT_DIR/model.gguf`` holding the same weights for llama.cpp. The tokenizer
is trained on the Python standard library's own source files, so the result depends on nothing
but this machine's Python. vLLM's CPU attention needs head_dim >= 64, so the tiny size uses 128
hidden units in 2 heads. Random weights run at the speed of real ones; their text is noise.

This file is executed by path with another interpreter: it must not import harvest.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

SIZES = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2),
    # ~100M parameters (12 layers of 768, vocab 8192): prefill costs on a CPU, so a prompt cache
    # shows (bench/prefix.py); built on CPU in well under a minute.
    "100m": dict(hidden_size=768, intermediate_size=2560, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=4),
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4),
}
SPECIAL = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:200]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(files, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return tok, fast


def write_gguf(path: str, state: dict, cfg: dict, tok, fast) -> None:
    """Write the same weights as a llama-architecture GGUF (f32) with a GPT-2 style BPE vocabulary."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(path, "llama")
    w.add_name("harvest-tiny")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    special_ids = {fast.convert_tokens_to_ids(s) for s in SPECIAL}
    types = [gguf.TokenType.CONTROL if i in special_ids else gguf.TokenType.NORMAL for i in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(fast.bos_token_id)
    w.add_eos_token_id(fast.eos_token_id)
    w.add_pad_token_id(fast.pad_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
                 "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
                 "self_attn.o_proj.weight": "attn_output.weight",
                 "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
                 "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
    for key, tensor in state.items():
        if key in names:
            name = names[key]
        else:
            _, _, layer, rest = key.split(".", 3)
            name = f"blk.{layer}.{per_layer[rest]}"
        # Q/K rows are left in HF order: with random weights the rotary pairing does not matter.
        w.add_tensor(name, tensor.float().numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--gguf", action="store_true", help="also write OUT/model.gguf for llama.cpp")
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args(argv)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    os.makedirs(args.out, exist_ok=True)
    tok, fast = train_tokenizer(args.vocab)
    fast.save_pretrained(args.out)
    cfg = dict(vocab_size=len(fast), max_position_embeddings=4096, bos_token_id=fast.bos_token_id,
               eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, rms_norm_eps=1e-6,
               tie_word_embeddings=False, **SIZES[args.size])
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.bfloat16)
    model.save_pretrained(args.out)
    params = sum(p.numel() for p in model.parameters())
    if args.gguf:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        write_gguf(os.path.join(args.out, "model.gguf"), state, cfg, tok, fast)
    print(json.dumps({"out": args.out, "vocab": len(fast), "params": params, "gguf": args.gguf}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
