"""Build a tiny random Llama, its byte-level BPE tokenizer and a chat template, entirely offline.

Nothing can be downloaded from a model hub on these machines, so the end-to-end tests and
`make demo` serve this model with a real vLLM instead. The directory ends in `<org>/<name>`
(default `.cache/models/sidecar-test/tiny-llama`) so that vLLM's `root` looks like an HF path.
The build is cached: it is redone only when this script changes. Run it with the vLLM venv's
Python (it needs torch, transformers and tokenizers):

    .venv-vllm/bin/python scripts/tiny_model.py [--out DIR]

It prints the model directory on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / ".cache/models/sidecar-test/tiny-llama"

# Head size 128/4 = 32: one of the head sizes vLLM's CPU attention accepts.
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 128, 2, 4, 2, 256
MAX_POSITIONS = 32768
BPE_VOCAB = 1024
SPECIAL = ["<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WORDS = (
    "the a model server sidecar request response token prompt stream error envelope upstream "
    "proxy metric counter latency name path root alias basename served batch chat completion "
    "hello world quick brown fox jumps over lazy dog zero one two three four five six seven "
    "eight nine ten reinforcement learning policy rollout reward gradient weight sync engine"
).split()


def corpus() -> list[str]:
    """A deterministic few thousand lines of text: enough for the BPE merges, no download."""
    lines = []
    for i in range(4000):
        n = 5 + i % 11
        lines.append(" ".join(WORDS[(i * 7 + j * (i % 13 + 1)) % len(WORDS)] for j in range(n)))
    lines.extend(str(i) for i in range(1000))
    return lines


def build_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(fast)


def build_model(out: Path, vocab_size: int) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=SPECIAL.index("<|bos|>"),
        eos_token_id=SPECIAL.index("<|eos|>"),
        pad_token_id=SPECIAL.index("<|pad|>"),
        tie_word_embeddings=False,
        dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(out)


def build(out: Path) -> Path:
    """Build into `out` unless a build from this very script is already there."""
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    stamp = out / f".built-{digest}"
    if stamp.exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build_model(tmp, build_tokenizer(tmp))
    (tmp / stamp.name).touch()
    # Swap in whole, so a crash mid-build never leaves a half model that looks finished.
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="ends in <org>/<name>")
    args = parser.parse_args(argv)
    print(build(args.out.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
