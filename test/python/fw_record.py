"""A program whose main is wrapped in torch.distributed.elastic's @record: the
failing rank's exception and traceback go to TORCHELASTIC_ERROR_FILE, and the
launcher's failure report shows them."""

from __future__ import annotations

import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


def load_shard(rank: int) -> None:
    raise FileNotFoundError(f"rank {rank}: shard-{rank:05d}.bin is missing from the data set")


@record
def main() -> None:
    rank = int(os.environ["RANK"])
    if rank == 1:
        load_shard(rank)
    time.sleep(30)  # the others are stopped when rank 1 fails


if __name__ == "__main__":
    main()
