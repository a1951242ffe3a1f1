"""Training and evaluating one probe head on a frozen backbone, and the Ray Train worker loop.

``run_probe`` is plain PyTorch (tests call it directly): frozen features (cached per split
or computed per batch), AdamW with linear warm-up and cosine decay on the head only, then
the task's evaluator over the validation split. It writes into ``out_dir``:
``metrics.json``, ``history.json`` (loss every few steps), ``head.safetensors`` (official
head layout of ``models.task_heads``) and ``overlays/*.png``.

``probe_worker`` is the Ray Train loop: one worker builds the frozen backbone once, runs
every requested probe in turn and reports each probe's metrics with its output folder as a
Ray Train checkpoint named ``probe_<task>``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from evaluation.config import KnnConfig, ProbeTaskConfig
from evaluation.features import CachedFeatureDataset, FrozenBackbone, cache_key, check_grid, extract_features
from evaluation.metrics import knn_top1
from evaluation.spec import settings_from_spec
from evaluation.tasks import TASKS, TaskData
from evaluation.visualize import save_png
from models.io import save_state_dict_file
from training.schedules import cosine

log = logging.getLogger("evaluation")
HISTORY_EVERY = 10


def warmup_cosine(step: int, total: int, warmup: int) -> float:
    """Learning-rate factor: linear warm-up to 1, then cosine decay to 0 at step ``total`` (one past
    the last step, the common fine-tuning convention; pretraining's ``training.schedules.
    warmup_cosine`` reaches its final value at the last step, as DINO's schedules do)."""
    if step < warmup:
        return (step + 1) / warmup
    return cosine(step - warmup, max(1, total - warmup), 1.0, 0.0)


def _batches(loader: DataLoader):
    while True:
        yield from loader


def run_probe(
    name: str,
    settings: ProbeTaskConfig,
    data: TaskData,
    extractor: FrozenBackbone,
    out_dir: str | Path,
    *,
    seed: int = 0,
    cache_dir: str | Path | None = None,
    cache_id: dict | None = None,
) -> dict[str, float]:
    """Train and evaluate the ``name`` probe; returns its metrics (also in ``out_dir``).

    With ``settings.cache_features``, each split's frozen features are computed once (and,
    given ``cache_dir`` and ``cache_id``, kept on disk for re-runs and other probes)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    train_ds, val_ds = TASKS[name].datasets(settings, data)
    check_grid(settings.image_size, extractor.stride, f"{name}.image_size")

    def features(ds, split: str) -> dict[str, torch.Tensor] | None:
        if not settings.cache_features:
            return None
        keep_maps = name != "knn"  # k-NN reads the CLS token only
        key = None
        if cache_dir is not None and cache_id is not None:
            digest = cache_key(inputs=ds.signature(), blocks=list(extractor.blocks), maps=keep_maps, **cache_id)
            key = Path(cache_dir) / f"{split}_{digest}.pt"
        return extract_features(extractor, ds, batch_size=settings.eval_batch_size, cache_file=key, keep_maps=keep_maps)

    train_feats, val_feats = features(train_ds, "train"), features(val_ds, "val")
    if name == "knn":
        metrics, history = _run_knn(settings, train_ds, val_ds, train_feats, val_feats, extractor), []
    else:
        t_feat = time.time()
        metrics, history = _run_head(name, settings, train_ds, val_ds, train_feats, val_feats, extractor, out_dir, seed)
        metrics.update(
            final_loss=history[-1]["loss"] if history else float("nan"),
            features_seconds=t_feat - t0,
            train_seconds=time.time() - t_feat,
        )
    metrics["seconds"] = time.time() - t0
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True))
    (out_dir / "history.json").write_text(json.dumps(history))
    log.info("probe %s: %s", name, {k: round(v, 4) for k, v in metrics.items()})
    return metrics


def _run_head(
    name: str,
    settings: ProbeTaskConfig,
    train_ds,
    val_ds,
    train_feats,
    val_feats,
    extractor: FrozenBackbone,
    out_dir: Path,
    seed: int,
) -> tuple[dict[str, float], list[dict]]:
    """Train the task's head, evaluate it, write its weights and overlays."""
    task = TASKS[name]
    train_src = CachedFeatureDataset(train_ds, train_feats) if train_feats else train_ds
    val_src = CachedFeatureDataset(val_ds, val_feats) if val_feats else val_ds
    torch.manual_seed(seed)  # here: iterating a DataLoader (feature extraction) draws from the global RNG
    head = task.head(extractor.out_dim, settings, extractor.stride, train_ds).to(extractor.device)
    history = _train_head(head, task.loss(settings, train_ds), train_src, extractor, settings, seed)
    evaluator = task.evaluator(settings, val_ds)
    head.eval()
    with torch.no_grad():
        for batch in DataLoader(val_src, batch_size=settings.eval_batch_size, shuffle=False):
            evaluator.update(_to_cpu(head(_features_of(batch, extractor))), batch)
    for img_name, image in evaluator.visuals():
        save_png(out_dir / "overlays" / f"{img_name}.png", image)
    save_state_dict_file(head, out_dir / "head.safetensors", metadata={"task": name, "in_dim": extractor.out_dim})
    return evaluator.compute(), history


def _features_of(batch: dict, extractor: FrozenBackbone) -> torch.Tensor:
    if "features" in batch:
        return batch["features"].to(extractor.device)
    return extractor(batch["image"])[0]


def _to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _to_cpu(out: dict) -> dict:
    return {k: v.float().cpu() for k, v in out.items()}


def _train_head(
    head: torch.nn.Module, loss_fn, train_src, extractor: FrozenBackbone, s: ProbeTaskConfig, seed: int
) -> list[dict]:
    if s.steps == 0:
        return []
    gen = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        train_src, batch_size=min(s.batch_size, len(train_src)), shuffle=True, drop_last=True, generator=gen
    )
    opt = torch.optim.AdamW(head.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: warmup_cosine(step, s.steps, s.warmup_steps))
    head.train()
    history, running = [], []
    for step, batch in zip(range(s.steps), _batches(loader)):
        out = head(_features_of(batch, extractor))
        loss = loss_fn(out, _to_device(batch, extractor.device))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"probe loss became {loss.item()} at step {step}; lower the learning rate")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        running.append(loss.item())
        if (step + 1) % HISTORY_EVERY == 0 or step + 1 == s.steps:
            history.append({"step": step + 1, "loss": sum(running) / len(running), "lr": sched.get_last_lr()[0]})
            running = []
    return history


def _run_knn(s: KnnConfig, train_ds, val_ds, train_feats, val_feats, extractor: FrozenBackbone) -> dict[str, float]:
    train_feats = train_feats or extract_features(extractor, train_ds, batch_size=s.eval_batch_size, keep_maps=False)
    val_feats = val_feats or extract_features(extractor, val_ds, batch_size=s.eval_batch_size, keep_maps=False)
    train_labels = torch.tensor([label for _, label in train_ds.items])
    val_labels = torch.tensor([label for _, label in val_ds.items])
    out = {}
    for k in s.k:
        out[f"top1_k{k}"] = knn_top1(
            train_feats["cls"],
            train_labels,
            val_feats["cls"],
            val_labels,
            k=k,
            temperature=s.temperature,
            num_classes=len(train_ds.classes),
        )
    return out


def probe_worker(spec: dict) -> None:
    """Ray Train loop (one worker): every probe of ``spec`` in turn, each reported with its
    output folder as checkpoint ``probe_<task>``. ``spec`` is ``evaluation.spec.worker_spec``'s dict."""
    import tempfile

    import ray.train
    import ray.train.torch
    from ray.train import Checkpoint

    from evaluation.features import load_frozen_backbone

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    device = ray.train.torch.get_device()
    bb = spec["backbone"]
    backbone = load_frozen_backbone(
        bb["name"], bb["checkpoint"], weights_prefix=bb["weights_prefix"], seed=spec["seed"], device=device
    )
    for item in spec["tasks"]:
        settings, data = settings_from_spec(item)
        extractor = FrozenBackbone(backbone, settings.feature_blocks, bb["dtype"])
        with tempfile.TemporaryDirectory() as tmp:
            metrics = run_probe(
                item["name"],
                settings,
                data,
                extractor,
                tmp,
                seed=spec["seed"],
                cache_dir=spec["cache_dir"],
                cache_id=item["cache_id"],
            )
            ray.train.report(
                {"task": item["name"], **metrics},
                checkpoint=Checkpoint.from_directory(tmp),
                checkpoint_dir_name=f"probe_{item['name']}",
            )
