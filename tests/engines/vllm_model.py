"""Write a tiny random-weight Llama and a BPE tokenizer that vLLM can serve.

Run with the vLLM venv's interpreter (it needs torch, transformers, tokenizers):
``.engines/vllm/bin/python tests/engines/vllm_model.py OUT_DIR``. Nothing is
downloaded: the tokenizer is trained here on generated text, the weights are
random (seeded). Output text is noise; the engine's timings are real.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

# head_dim 64: vLLM's CPU attention refused head_dim 16 ("Unsupported CPU attention configuration").
HIDDEN, INTERMEDIATE, LAYERS, HEADS = 256, 512, 2, 4
VOCAB = 1024
MARKER = "pcie-tui-tiny-llama-v1"


def _corpus(n_lines: int = 4000, seed: int = 0) -> list[str]:
    """Generated word salad: enough distinct strings for BPE to learn VOCAB tokens."""
    rng = random.Random(seed)
    syll = ["ka", "to", "ri", "ne", "su", "mo", "la", "pi", "de", "vo", "gu", "sha", "tre", "bli", "on", "ex"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))) for _ in range(n_lines)]


def write_model(out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    fast.save_pretrained(out)
    vocab = len(fast)

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=1024,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    (out / "pcie_tui_model.json").write_text(json.dumps({"marker": MARKER, "vocab_size": vocab}))
    return out


def is_written(out: Path) -> bool:
    try:
        return json.loads((out / "pcie_tui_model.json").read_text()).get("marker") == MARKER
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    target = Path(sys.argv[1])
    if not is_written(target):
        write_model(target)
    print(json.loads((target / "pcie_tui_model.json").read_text())["vocab_size"])
