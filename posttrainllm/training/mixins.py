"""The mixins every trainer gets: LLRDMixin puts the layer-wise LR groups in through `create_optimizer` (the hook
FSDP and DeepSpeed respect, unlike `optimizers=`), with the checks that the ranks hold the same groups;
DivergenceGuardMixin stops a run whose loss or gradient norm became NaN/inf; EngineMixin sets up FSDP2 on CPU."""

from __future__ import annotations

import inspect
import math
import os

from posttrainllm.errors import ModelError, TrainingError, UsageError


class LLRDMixin:
    """Mixed in before a transformers/TRL trainer class, which then takes the run's one plan (llrd.LLRDPlan) as the
    keyword `llrd_plan=` of its constructor and keeps it as `self.llrd_plan` (None: the trainer's own optimizer).

    The optimizer gets the plan's groups (re-mapped by name onto the trainer's model when it wraps it), with the
    optimizer class and kwargs from the user's `--optim` via `get_optimizer_cls_and_kwargs`, so fused/foreach
    AdamW, Adafactor, 8-bit AdamW... all get our groups. Optimizers that build their own groups (GaLore, LOMO,
    Muon...) are refused when the plan scales any depth, and get transformers' own setup when it does not.
    """

    def __init__(self, *args, llrd_plan=None, **kwargs):
        self.llrd_plan = llrd_plan  # before the trainer's own __init__: the plan is there whenever it is read
        super().__init__(*args, **kwargs)

    def create_optimizer(self, model=None):
        plan = self.llrd_plan
        if self.optimizer is not None or plan is None:
            return super().create_optimizer(model)
        opt_model = self.model if model is None else model
        optimizer_cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
        if not inspect.isclass(optimizer_cls) or {"params", "model", "optimizer_dict"} & set(kwargs):
            if plan.lr_scaled:
                raise UsageError(
                    f"--optim {self.args.optim} builds its own parameter groups, so it cannot apply layer-wise LR "
                    "decay; use an AdamW variant (e.g. adamw_torch) or drop --llrd"
                )
            return super().create_optimizer(model)
        try:
            groups = plan.groups_for(opt_model)
        except ValueError as e:
            raise ModelError(f"the trainer's model differs from the planned one: {e}") from None
        groups = _split_by_device_mesh(groups)
        agreed = _check_same_groups_on_every_rank(groups)
        if agreed and self.is_world_process_zero():
            print(f"parameter groups: identical on all {agreed[1]} ranks (fingerprint {agreed[0][:16]})", flush=True)
        self.optimizer = optimizer_cls(groups, **kwargs)
        return self.optimizer

    def create_model_card(self, *args, **kwargs):
        # TRL writes a generic card at every checkpoint; posttrainllm writes its own once the final model is saved.
        return None

    def _load_optimizer_and_scheduler(self, checkpoint):
        # Loading an optimizer state dict restores the *saved* group LRs. Resuming is refused when the LR settings
        # changed unless --allow-config-change, and then the new per-group LRs are put back here, at the resumed
        # point of the schedule.
        super()._load_optimizer_and_scheduler(checkpoint)
        plan = self.llrd_plan
        if checkpoint is None or plan is None or self.lr_scheduler is None:
            return
        groups = self.optimizer.param_groups
        if len(groups) != len(plan.groups):
            return
        _put_back_hyperparameters(self.optimizer, plan.groups)
        new = [g["lr"] for g in plan.groups]
        if all(g.get("initial_lr") == lr for g, lr in zip(groups, new)):
            return
        sched = self.lr_scheduler
        for i, (g, lr) in enumerate(zip(groups, new)):
            g["initial_lr"] = lr
            factor = sched.lr_lambdas[i](sched.last_epoch) if hasattr(sched, "lr_lambdas") else 1.0
            g["lr"] = lr * factor
        if hasattr(sched, "base_lrs"):
            sched.base_lrs = list(new)
            sched._last_lr = [g["lr"] for g in groups]

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        # HF logs group 0's LR, which is the embeddings' under layer decay. Log the base (head) LR as
        # `learning_rate`, plus the smallest and largest group LR at the same point of the schedule (every group
        # follows the same schedule, so the current LRs keep the initial ratios).
        if self.optimizer is not None and "learning_rate" in logs:
            initial = [g.get("initial_lr", g["lr"]) for g in self.optimizer.param_groups]
            if initial and initial[0] > 0:
                now = logs["learning_rate"] / initial[0]  # the schedule factor at this step
                base = self.llrd_plan.base_lr if self.llrd_plan is not None else max(initial)
                logs["learning_rate"] = base * now
                logs["lr_min"] = min(initial) * now
                logs["lr_max"] = max(initial) * now
                plan = self.llrd_plan
                if plan is not None and plan.lr_scaled:  # every depth's LR as its own scalar (lr/block_0 ...)
                    for row in plan.rows:
                        logs[f"lr/{row['block']}"] = row["lr"] * now
        super().log(logs, *args, **kwargs)


def _put_back_hyperparameters(optimizer, planned: list[dict]) -> None:
    """Loading an optimizer state dict also restores the saved groups' hyperparameters (betas, eps, weight decay...).
    Resuming refuses a change of them unless --allow-config-change, and then the run trains with the new ones: the
    optimizer's own defaults (built from this run's arguments) and the plan's per-group weight decay."""
    defaults = getattr(optimizer, "defaults", None) or {}
    for group, plan_group in zip(optimizer.param_groups, planned):
        for key, value in defaults.items():
            if key in ("lr", "initial_lr", "params") or key not in group:
                continue
            group[key] = plan_group.get(key, value) if key == "weight_decay" else value


class EngineMixin:
    """FSDP on a machine without GPUs: accelerate (1.15) turns an FSDP launch into FSDP only on accelerator devices
    and silently trains it as plain DDP on CPU, every rank holding the whole model and optimizer state. FSDP2 itself
    (torch's ``fully_shard``) runs on CPU with gloo, so an FSDP2 launch on CPU is switched to accelerate's own FSDP2
    path: DTensor parameters, a sharded optimizer state and sharded checkpoints, as on GPUs. FSDP1 needs GPUs and is
    refused on CPU instead of silently running as DDP."""

    def create_accelerator_and_postprocess(self):
        on_cpu = _fsdp_version_on_cpu(self.args)
        if on_cpu is not None and on_cpu != "2":
            raise UsageError(
                f"FSDP version {on_cpu} needs GPUs: on CPU accelerate would train this launch as plain DDP; use "
                "fsdp_version: 2 in the accelerate config (examples/accelerate/fsdp2_cpu.yaml), or run on GPUs"
            )
        super().create_accelerator_and_postprocess()
        if on_cpu == "2":
            _switch_to_fsdp2(self)


def _fsdp_version_on_cpu(args) -> str | None:
    """The FSDP version the launch asks for ("1", "2") when it runs on CPU; None without FSDP or on GPUs."""
    fsdp_args = getattr(args, "fsdp_plugin_args", None)
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true" and fsdp_args is None:
        return None
    from posttrainllm.distributed import on_cpu

    if not (args.use_cpu or on_cpu()):
        return None
    return str((fsdp_args or {}).get("fsdp_version") or os.environ.get("FSDP_VERSION", "1"))


def _switch_to_fsdp2(trainer) -> None:
    """Turn the MULTI_CPU (DDP) state accelerate built for an FSDP2 launch into its FSDP2 state (see EngineMixin)."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if trainer.is_fsdp_enabled:
        return
    state = trainer.accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU:
        return
    fsdp_args = getattr(trainer.args, "fsdp_plugin_args", None)
    plugin = FullyShardedDataParallelPlugin(**fsdp_args) if fsdp_args else FullyShardedDataParallelPlugin()
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    trainer.is_fsdp_enabled = True


class DivergenceGuardMixin:
    """Stops a run whose loss or gradient norm becomes NaN/inf (exit 1) before anything is saved from it.

    No per-step host sync: transformers' NaN filter (which syncs every step and hides a NaN loss behind the running
    mean) is off, so the on-device loss accumulator itself turns NaN/inf; non-finite gradient norms are OR-ed into an
    on-device flag. Both are read only where the trainer syncs anyway: at logging, evaluation and checkpoint points
    and at the last step. A checkpoint is only written after that check and a check of the weights themselves, so
    the last checkpoint on disk is always a good one. Under fp16 mixed precision an infinite gradient norm is the
    loss scaler's normal overflow signal (the step is skipped), so only the loss is watched there.
    """

    _nf_grad = None  # on-device bool: some gradient norm since the last check was NaN/inf
    _nf_grad_host = False
    _nf_checked = None  # last step that passed the check

    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, *args, **kwargs):
        self._note_grad_norm(grad_norm)
        c = self.control
        if c.should_log or c.should_save or c.should_evaluate or c.should_training_stop:
            self._raise_if_diverged(tr_loss)
        return super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)

    def _save_checkpoint(self, model, trial):
        from posttrainllm.rundir.checkpoints import nonfinite_parameters

        self._raise_if_diverged(getattr(self, "_tr_loss", None))
        bad = nonfinite_parameters(self.model)
        if bad:
            raise TrainingError(self._divergence_message(f"the weights hold NaN/inf values ({', '.join(bad)}, ...)"))
        try:
            return super()._save_checkpoint(model, trial)
        except (OSError, RuntimeError) as e:  # a full disk: OSError(ENOSPC), or torch's writer's RuntimeError
            from pathlib import Path

            from posttrainllm.rundir.checkpoints import checkpoint_bytes, disk_full_error

            ckpt = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
            full = disk_full_error(e, ckpt, checkpoint_bytes(ckpt.parent, self.model))
            if full is None:
                raise
            raise full from e

    def _note_grad_norm(self, grad_norm) -> None:
        if grad_norm is None or self.args.fp16:
            return
        import torch

        if isinstance(grad_norm, torch.Tensor):
            bad = ~torch.isfinite(grad_norm.detach())
            self._nf_grad = bad if self._nf_grad is None else (self._nf_grad | bad.to(self._nf_grad.device))
        elif not math.isfinite(float(grad_norm)):
            self._nf_grad_host = True

    def _raise_if_diverged(self, tr_loss) -> None:
        import torch

        from posttrainllm.distributed import max_over_ranks

        flags = []
        if isinstance(tr_loss, torch.Tensor):
            flags.append(~torch.isfinite(tr_loss.detach()).reshape(()))
        if self._nf_grad is not None:
            flags.append(self._nf_grad.reshape(()).to(flags[0].device) if flags else self._nf_grad.reshape(()))
        mine = self._nf_grad_host or (bool(torch.stack(flags).any()) if flags else False)  # the one sync
        if not max_over_ranks(int(mine)):  # every rank stops at the same check (each rank has its own loss)
            self._nf_checked = self.state.global_step
            self._nf_grad = None
            return
        if not mine:
            what = "another rank's training loss or gradient norm"
        else:
            what = "the training loss" if isinstance(tr_loss, torch.Tensor) and bool(flags[0]) else "the gradient norm"
        raise TrainingError(self._divergence_message(f"{what} became NaN/inf"))

    def _divergence_message(self, what: str) -> str:
        from posttrainllm.rundir.layout import newest_good_checkpoint

        step = self.state.global_step
        since = self._nf_checked if self._nf_checked is not None else getattr(self, "_initial_global_step", 0)
        when = f"at step {step}" if step - since <= 1 else f"between steps {since + 1} and {step}"
        good = newest_good_checkpoint(self.args.output_dir)
        kept = (
            f"the last good checkpoint is {good} "
            "(continue from it with --resume --allow-config-change and a lower --lr)"
            if good
            else "no checkpoint had been saved"
        )
        low_precision = bool(self.args.bf16 or self.args.fp16)
        advice = divergence_advice(
            self.args.learning_rate, low_precision=low_precision, kl_beta=float(getattr(self, "kl_beta", 0.0) or 0.0)
        )
        return (
            f"training diverged: {what} {when}; nothing from that point was saved and no final model was written "
            f"({kept}). {advice}"
        )


KL_BETA_HUGE = 100.0  # a --kl-to-base above this is named as the likely cause of a divergence


def divergence_advice(lr: float, *, low_precision: bool, kl_beta: float) -> str:
    """What to try after a divergence, from the run's fields: a lower LR and a warmup always; fp32 only when the run
    was not in fp32 (bf16/fp16); the KL anchor's weight when it is on, named as the likely cause when huge."""
    tries = [f"a lower --lr (now {lr:g})", "a warmup (--warmup-ratio 0.05)"]
    if low_precision:
        tries.append("--precision fp32")
    if kl_beta > KL_BETA_HUGE:
        return (
            f"The likely cause is the KL anchor's weight --kl-to-base {kl_beta:g}: the loss adds β × KL(base ‖ model), "
            f"so any move from the base overflows; give a β of 0.01 to 1 (else try {_either(tries)})"
        )
    if kl_beta > 0:
        tries.append(f"a lower --kl-to-base (now {kl_beta:g})")
    return f"Try {_either(tries)}"


def _either(items: list[str]) -> str:
    """ "a, b or c"."""
    return ", ".join(items[:-1]) + f" or {items[-1]}" if len(items) > 1 else items[0]


class ResumedOrderMixin:
    """grpo / rloo / distill: TRL's RepeatSampler draws each epoch's prompt order from one generator that lives as
    long as the process, so a run resumed in epoch k would start that generator afresh and replay epoch 1's order.
    Here the sampler first draws (and drops) the orders of the epochs the checkpoint already trained, so a resumed
    run sees the prompts in the order the uninterrupted one did."""

    def _get_train_sampler(self, *args, **kwargs):
        sampler = super()._get_train_sampler(*args, **kwargs)
        generator = getattr(sampler, "generator", None)
        if generator is None or not getattr(sampler, "shuffle", False):
            return sampler
        trainer = self

        class _Resumed(type(sampler)):
            def __iter__(self):
                import torch

                if not getattr(self, "_advanced", False):  # once, at the first epoch this process iterates
                    self._advanced = True
                    for _ in range(int(trainer.state.epoch or 0)):
                        torch.randperm(self.num_samples, generator=self.generator)
                return super().__iter__()

        sampler.__class__ = _Resumed
        return sampler


def _split_by_device_mesh(groups: list[dict]) -> list[dict]:
    """Parameters on different device meshes (FSDP2 on a 2-D mesh, expert parallelism) cannot share one
    fused/foreach kernel call: give each mesh its own group, as transformers does for its own groups."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return groups
    out: list[dict] = []
    for g in groups:
        meshes: dict = {}
        for p in g["params"]:
            meshes.setdefault(p.device_mesh if isinstance(p, DTensor) else None, []).append(p)
        out.extend({**g, "params": params} for params in meshes.values())
    return out


def _check_same_groups_on_every_rank(groups: list[dict]) -> tuple[str, int] | None:
    """Under DDP/FSDP every rank must build identical groups (names, LRs, parameter shapes), or ranks diverge.
    Returns (the groups' fingerprint, number of ranks) when every rank has the same; None outside torch.distributed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    import hashlib

    desc = [(g["name"], g["lr"], g["weight_decay"], [tuple(p.shape) for p in g["params"]]) for g in groups]
    mine = hashlib.sha256(repr(desc).encode()).hexdigest()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if len(set(every)) != 1:
        raise ModelError(
            f"ranks built different LLRD parameter groups ({len(set(every))} "
            "distinct layouts); every rank must load the same model and options"
        )
    return mine, len(every)


def check_distributed_engine(trainer, llrd_active: bool) -> None:
    """FSDP needs per-parameter groups (use_orig_params / FSDP2); a DeepSpeed config with its own "optimizer"
    would silently replace our groups, so both are refused when layer decay is on."""
    if not llrd_active:
        return
    if getattr(trainer, "is_deepspeed_enabled", False):
        plugin = trainer.accelerator.state.deepspeed_plugin
        ds_config = getattr(plugin, "deepspeed_config", None) or {}
        if "optimizer" in ds_config:
            raise UsageError(
                'the DeepSpeed config defines its own "optimizer", which replaces the '
                'layer-wise LR groups; remove the "optimizer" section (posttrainllm '
                "builds AdamW with per-block groups) or drop --llrd"
            )
    if getattr(trainer, "is_fsdp_enabled", False):
        plugin = trainer.accelerator.state.fsdp_plugin
        if getattr(plugin, "fsdp_version", 1) == 1 and not getattr(plugin, "use_orig_params", False):
            raise UsageError(
                "FSDP with use_orig_params=false flattens parameters across blocks, so "
                "per-block LRs cannot apply; set fsdp_use_orig_params: true in the "
                "accelerate config (or use FSDP2)"
            )
