"""PyTorch Lightning under gpulaunch: Trainer(strategy="ddp", num_nodes=N) on
CPUs finds the launcher's world through its TorchElasticEnvironment and
trains; every rank prints what it saw and the hash of its parameters."""

from __future__ import annotations

import hashlib
import os
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                        num_nodes=int(sys.argv[1]), strategy="ddp", max_steps=12, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    model = Model()
    trainer.fit(model, data)
    h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    env = type(trainer.strategy.cluster_environment).__name__
    print(f"rank {trainer.global_rank} of {trainer.world_size} node {trainer.node_rank} "
          f"env {env} params_sha256 {h.hexdigest()}", flush=True)
    trainer.strategy.barrier()
    # torch 2.15's Gloo group aborts now and then when torn down at exit
    # ("terminate called without an active exception"): past the barrier
    # nothing is left to do, so leave without tearing it down
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
