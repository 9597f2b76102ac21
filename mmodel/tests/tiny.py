"""A tiny Hugging Face model folder for tests: a Llama of ~100k random parameters and a
byte-level BPE tokenizer (with a chat template), saved as safetensors. Built in about a second,
offline."""

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Python is a programming language that lets you work quickly.",
    "A model answers questions; a benchmark scores the answers.",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "1 2 3 4 5 6 7 8 9 10 one two three four five six seven eight nine ten",
] * 20


def tiny_tokenizer(folder: Path, vocab_size: int = 384):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=vocab_size, min_frequency=1,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer,
                                        bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                        pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def tiny_model(folder: Path, *, seed: int = 0, hidden: int = 32, layers: int = 2) -> Path:
    """Save a tiny Llama and its tokenizer into `folder` (created); return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.max_new_tokens = 16
    model.save_pretrained(str(folder), safe_serialization=True)
    for path in folder.iterdir():  # as the registry records a version (save_pretrained: 0600)
        path.chmod(0o644)
    return folder
