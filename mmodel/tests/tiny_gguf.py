"""A tiny GGUF file for tests: the Llama of `tiny_model` written the way llama.cpp's converter
writes one (tensor names, rotary permutation of q/k, a GPT-2 style BPE vocabulary), in float32
so the weights read back exactly."""

import json
from pathlib import Path

# Hugging Face names -> GGUF names of a Llama block.
_BLOCK = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def _permute(weights, heads: int):
    """llama.cpp's order of the rotary halves (transformers undoes it when it loads)."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, index, rest = name.split(".", 3)
    part = rest.rsplit(".", 1)[0]
    return f"blk.{index}.{_BLOCK[part]}.weight"


def tiny_gguf(model_folder: Path, target: Path) -> Path:
    """Write the model saved in `model_folder` (by `tiny_model`) as the GGUF file `target`."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((model_folder / "config.json").read_text())
    tokenizer = json.loads((model_folder / "tokenizer.json").read_text())
    vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda item: item[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    special = {token["content"] for token in tokenizer.get("added_tokens", [])}
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    target.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(target), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config["hidden_size"] // heads)
    writer.add_rope_freq_base(float(config.get("rope_theta")
                                    or config["rope_parameters"]["rope_theta"]))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([gguf.TokenType.CONTROL if token in special
                            else gguf.TokenType.NORMAL for token, _ in vocab])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    for name, tensor in load_file(str(model_folder / "model.safetensors")).items():
        if name.endswith("q_proj.weight"):
            tensor = _permute(tensor, heads)
        elif name.endswith("k_proj.weight"):
            tensor = _permute(tensor, kv_heads)
        writer.add_tensor(_gguf_name(name), tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
