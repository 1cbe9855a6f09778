"""Train a course model on the standard-library corpus; resumable; exports a shipped checkpoint.

    python -m helpers.train --preset target --tokens 60e6 --export target
    python -m helpers.train --preset draft  --tokens 20e6 --export draft

Fixed seeds; batches are drawn from a generator keyed on (seed, step), so a resumed run sees exactly
the batches an uninterrupted one would. AdamW (weight decay on matrices only), linear warmup then
cosine decay to 10% of the peak learning rate. Validation loss is reported in bits per byte on the
held-out files. The run's state (weights, optimizer moments, step) is saved to `runs/<name>/` every
few minutes as safetensors + JSON, and the same command continues from it. CPU by default (2 threads
here), CUDA when present (bf16 autocast).

Out of scope: multi-GPU, gradient accumulation, mixed-precision on the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from . import data
from .checkpoint import MANIFEST, TOKENIZER_FILE, model_from_file, save_checkpoint, sha256_file
from .device import default_device
from .measure.evaluate import bits_per_byte
from .model import ModelConfig, Transformer
from .paths import CHECKPOINTS, RUNS
from .tokenizer import Tokenizer


def lr_at(step: int, total: int, peak: float, warmup: int, final_frac: float = 0.1) -> float:
    """Linear warmup to `peak`, then cosine decay to `final_frac * peak` at step `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


def get_batch(ids: np.ndarray, batch_size: int, seq_len: int, seed: int, step: int):
    """Random windows of the token stream; the same (seed, step) always gives the same batch."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(ids) - seq_len - 1, size=batch_size)
    arr = np.stack([ids[s : s + seq_len + 1] for s in starts]).astype(np.int64)  # (B, T+1)
    t = torch.from_numpy(arr)
    return t[:, :-1], t[:, 1:]  # inputs (B, T), targets (B, T)


def make_optimizer(model, lr: float, weight_decay: float):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def save_state(run_dir: Path, model, opt, step: int, tokens_seen: int, args: dict, history: list) -> None:
    """Resume state: fp32 weights and AdamW moments (safetensors), step and settings (JSON)."""
    tensors = {f"model/{k}": v.detach().cpu() for k, v in model.state_dict().items() if k != "head.weight"}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if st:
                tensors[f"exp_avg/{names[id(p)]}"] = st["exp_avg"].cpu()
                tensors[f"exp_avg_sq/{names[id(p)]}"] = st["exp_avg_sq"].cpu()
                tensors[f"opt_step/{names[id(p)]}"] = torch.as_tensor(st["step"]).reshape(1).float().cpu()
    tmp = run_dir / "state.safetensors.tmp"
    save_file(tensors, str(tmp))
    tmp.replace(run_dir / "state.safetensors")
    (run_dir / "state.json").write_text(
        json.dumps({"step": step, "tokens_seen": tokens_seen, "args": args, "history": history}, indent=1)
    )


def load_state(run_dir: Path, model, opt) -> dict:
    tensors = load_file(str(run_dir / "state.safetensors"))
    sd = {k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")}
    sd["head.weight"] = sd["embed.weight"]
    model.load_state_dict(sd)
    for n, p in model.named_parameters():
        if f"exp_avg/{n}" in tensors:
            opt.state[p] = {
                "exp_avg": tensors[f"exp_avg/{n}"].to(p.device),
                "exp_avg_sq": tensors[f"exp_avg_sq/{n}"].to(p.device),
                "step": tensors[f"opt_step/{n}"].reshape(()).to(p.device),
            }
    return json.loads((run_dir / "state.json").read_text())


def distill_loss(logits, teacher_logits, temperature: float = 1.0):
    """KL(teacher || student) per token, the draft's extra objective when a teacher is given."""
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    s = F.log_softmax(logits.float() / temperature, dim=-1)
    return F.kl_div(s.flatten(0, 1), t.flatten(0, 1), log_target=True, reduction="batchmean")


def train_steps(
    model,
    ids: np.ndarray,
    steps: int,
    batch_size: int = 8,
    seq_len: int = 128,
    lr: float = 3e-3,
    seed: int = 0,
    causal: bool = True,
    progress: bool = True,
    desc: str = "training",
) -> list[float]:
    """A short training run for notebooks: AdamW, constant learning rate after a brief warmup.

    Returns the training loss (nats/token) at every step. `causal=False` trains without the causal
    mask (chapter 03's cautionary experiment). Deterministic for a given seed and thread count.
    """
    if steps < 1 or batch_size < 1 or seq_len < 1:
        raise ValueError(f"steps, batch_size and seq_len must be >= 1; got {steps}, {batch_size}, {seq_len}")
    if len(ids) < seq_len + 2:
        raise ValueError(f"ids has {len(ids)} tokens; need at least seq_len + 2 = {seq_len + 2}")
    opt = make_optimizer(model, lr, weight_decay=0.0)
    warmup = max(1, steps // 20)
    losses = []
    it = range(steps)
    if progress:
        from .progress import progress_bar

        it = progress_bar(it, desc=desc, unit="step")
    model.train()
    for step in it:
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / warmup)
        x, y = get_batch(ids, batch_size, seq_len, seed, step)
        x, y = x.to(model.device), y.to(model.device)
        logits = model(x, check=False, causal=causal)  # (B, T, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", required=True, help="model preset from helpers.model.PRESETS (target, draft, tiny)")
    ap.add_argument("--name", help="run name (folder under runs/); default: the preset")
    ap.add_argument("--tokens", type=float, default=20e6, help="training tokens in total (sets the schedule)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=None, help="training window; default: the context window")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=float, default=0.02, help="fraction of steps spent warming up")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--eval-every", type=int, default=250, help="steps between validation estimates")
    ap.add_argument("--eval-windows", type=int, default=24, help="validation windows per estimate")
    ap.add_argument("--save-minutes", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--device", default=None, help="cpu or cuda; default: cuda if present")
    ap.add_argument("--teacher", default=None, help="distil from this shipped checkpoint (e.g. target)")
    ap.add_argument("--distill-weight", type=float, default=0.5)
    ap.add_argument("--export", default=None, help="write helpers/checkpoints/<EXPORT>.safetensors at the end")
    ap.add_argument("--fresh", action="store_true", help="ignore saved state and start over")
    ap.add_argument("--compile", action="store_true", help="torch.compile the training step (faster after warmup)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from .progress import progress_bar

    torch.set_num_threads(args.threads)
    device = torch.device(args.device) if args.device else default_device()
    cfg = ModelConfig.from_preset(args.preset)
    seq_len = args.seq_len or cfg.max_seq_len
    name = args.name or args.preset
    run_dir = RUNS / name
    run_dir.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer.load(TOKENIZER_FILE)
    tok_sha = sha256_file(TOKENIZER_FILE)
    if tok.vocab_size != cfg.vocab_size:
        raise SystemExit(f"preset {args.preset} has vocab_size {cfg.vocab_size}, the tokenizer {tok.vocab_size}")
    files = data.list_corpus_files()
    fingerprint = data.corpus_fingerprint(files)
    print("corpus:", json.dumps(fingerprint))
    train_ids, _ = data.token_cache(tok, "train", tok_sha)
    val_ids = data.encode_documents(tok, data.validation_documents())
    print(f"train tokens {len(train_ids):,}  validation tokens {len(val_ids):,}")

    torch.manual_seed(args.seed)
    model = Transformer(cfg).to(device)
    opt = make_optimizer(model, args.lr, args.weight_decay)
    tokens_per_step = args.batch_size * seq_len
    total_steps = max(1, int(args.tokens // tokens_per_step))
    warmup = max(1, int(args.warmup * total_steps))
    step, tokens_seen, history = 0, 0, []
    if (run_dir / "state.json").exists() and not args.fresh:
        state = load_state(run_dir, model, opt)
        step, tokens_seen, history = state["step"], state["tokens_seen"], state["history"]
        print(f"resuming {run_dir} at step {step} ({tokens_seen:,} tokens seen)")

    teacher = None
    if args.teacher:
        teacher = model_from_file(CHECKPOINTS / f"{args.teacher}.safetensors", device=device)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    )
    print(f"{cfg}\nparameters {model.num_parameters():,}; {total_steps} steps of {tokens_per_step} tokens")
    forward = torch.compile(model) if args.compile else model

    bar = progress_bar(total=total_steps, initial=step, desc=f"train {name}", unit="step", dynamic_ncols=True)
    last_save = time.time()
    t_start, tokens_at_start = time.time(), tokens_seen
    model.train()
    while step < total_steps:
        lr = lr_at(step, total_steps, args.lr, warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = get_batch(train_ids, args.batch_size, seq_len, args.seed, step)
        x, y = x.to(device), y.to(device)
        with autocast:
            logits = forward(x, check=False)  # (B, T, V)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            if teacher is not None:
                with torch.no_grad():
                    t_logits = teacher(x, check=False)
                loss = (1 - args.distill_weight) * loss + args.distill_weight * distill_loss(logits, t_logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += tokens_per_step
        rate = (tokens_seen - tokens_at_start) / (time.time() - t_start)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.1e}", tok_s=f"{rate:,.0f}")
        if step % args.eval_every == 0 or step == total_steps:
            val = bits_per_byte(model, tok, val_ids, seq_len=seq_len, max_windows=args.eval_windows)
            history.append(
                {
                    "step": step,
                    "tokens": tokens_seen,
                    "train_loss": round(loss.item(), 4),
                    "val_bpb_estimate": round(val["bits_per_byte"], 4),
                    "elapsed_s": round(time.time() - t_start),
                }
            )
            bar.write(json.dumps(history[-1]))
            model.train()
        if time.time() - last_save > args.save_minutes * 60 or step == total_steps:
            save_state(run_dir, model, opt, step, tokens_seen, vars(args), history)
            last_save = time.time()
    bar.close()

    if args.export:
        export(model, tok, val_ids, args, fingerprint, step, tokens_seen, history, seq_len, argv, len(train_ids))


def export(model, tok, val_ids, args, fingerprint, steps, tokens_seen, history, seq_len, argv, train_tokens):
    """Round the weights to the stored float16, measure them on all validation text, write the file."""
    path = CHECKPOINTS / f"{args.export}.safetensors"
    model = model.to("cpu", torch.float16).to(torch.float32).eval()  # exactly what will be loaded
    val = bits_per_byte(model, tok, val_ids, seq_len=seq_len, progress=True)
    record = {
        "preset": args.preset,
        "parameters": model.num_parameters(),
        "corpus": fingerprint,
        "tokenizer_sha256": sha256_file(TOKENIZER_FILE),
        "train_tokens": train_tokens,
        "steps": steps,
        "tokens_seen": tokens_seen,
        "batch_size": args.batch_size,
        "seq_len": seq_len,
        "peak_lr": args.lr,
        "seed": args.seed,
        "teacher": args.teacher,
        "val_bits_per_byte": round(val["bits_per_byte"], 4),
        "val_nats_per_token": round(val["nats_per_token"], 4),
        "val_tokens": val["tokens"],
        "val_bytes": val["bytes"],
        "history": history,
    }
    sha = save_checkpoint(model, path, record)
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    cmd = "python -m helpers.train " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    manifest[args.export] = {
        "file": path.name,
        "sha256": sha,
        "command": cmd,
        "val_bits_per_byte": record["val_bits_per_byte"],
        "parameters": record["parameters"],
    }
    manifest["tokenizer"] = {
        "file": TOKENIZER_FILE.name,
        "sha256": sha256_file(TOKENIZER_FILE),
        "command": "python -m helpers.train_tokenizer",
    }
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"exported {path} ({path.stat().st_size:,} bytes): validation {record['val_bits_per_byte']} bits/byte")


if __name__ == "__main__":
    main()
