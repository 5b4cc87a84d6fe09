"""The feature stream from a target rank to a drafter rank (split mode): wire format and flow.

Per batch the target sends a header over the gloo control group (CPU, so reading it never
stalls a GPU) and the payload over the data group (NCCL between GPUs, gloo on the CPU): token
ids int64 [rows, S], loss mask uint8 [rows, S], features [rows, S, n*H]. Shapes are fixed for
the run (static shapes), so a drafter posts its receives before the batch exists.

Flow control by credits: a drafter always has receives posted for the next `depth` batches,
and each credit it sends says "one more is posted" (or "stop"). The target sends batch n only
after the credit for batch n - depth, so it runs up to `depth` batches ahead, and every send
finds its receive waiting (the transfer time is the copy, not a wait for the other side).
After a stop the drafter receives what is still in flight: the target has sent exactly
(continue credits + depth) batches, and both sides exit with nothing pending.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

# Header (float64): batch number, unpadded tokens, the data order's epoch / index / position /
# sample count after this step (its data hash the drafter knows from the start), then the
# target's seconds per step of its previous step: forward, transfer, idle (-1: not known yet).
HEADER_FIELDS = (
    "seq",
    "num_tokens",
    "epoch",
    "index",
    "position",
    "num_samples",
    "target_forward",
    "transfer",
    "target_idle",
)
UNKNOWN = -1.0


@dataclass(frozen=True)
class WireShape:
    rows: int
    seq_len: int
    feature_dim: int
    feature_dtype: torch.dtype

    def empty_payload(self, device: torch.device) -> list[Tensor]:
        return [
            torch.empty(self.rows, self.seq_len, dtype=torch.long, device=device),
            torch.empty(self.rows, self.seq_len, dtype=torch.uint8, device=device),
            torch.empty(
                self.rows, self.seq_len, self.feature_dim, dtype=self.feature_dtype, device=device
            ),
        ]


def header_tensor(values: dict[str, float]) -> Tensor:
    return torch.tensor([float(values[name]) for name in HEADER_FIELDS], dtype=torch.float64)


def send_payload(
    input_ids: Tensor, loss_mask: Tensor, features: Tensor, dst: int
) -> list[dist.Work]:
    """Start sending one batch's tensors (data group); wait on the works before reusing them."""
    tensors = [input_ids, loss_mask.to(torch.uint8), features]
    return [work for t in tensors if (work := dist.isend(t.contiguous(), dst)) is not None]


def send_header(values: dict[str, float], dst: int, control: Any) -> dist.Work:
    work = dist.isend(header_tensor(values), dst, group=control)
    assert work is not None
    return work


def wait_credit(src: int, control: Any) -> bool:
    """Block until a drafter's next credit: True for one more batch, False for stop."""
    credit = torch.zeros(1)
    dist.recv(credit, src, group=control)
    return bool(credit.item() > 0)


def send_frozen(
    tensors: dict[str, Tensor], mask_token_id: int, data: dict[str, Any], dst: int, control: Any
) -> None:
    """Target -> drafter at start: the MASK id, what the data are (the store's summary, which
    the lead reports) and the frozen embedding / lm_head (one tensor when tied), which the
    drafter shares instead of loading the whole target."""
    names = list(tensors)
    tied = len(names) == 2 and tensors[names[0]] is tensors[names[1]]
    meta = {
        "mask_token_id": mask_token_id,
        "data": data,
        "tied": tied,
        "shapes": {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()},
    }
    dist.send_object_list([meta], dst, group=control)
    for name in names[:1] if tied else names:
        dist.send(tensors[name].contiguous(), dst)


def recv_frozen(
    src: int, device: torch.device, control: Any
) -> tuple[dict[str, Tensor], int, dict[str, Any]]:
    box: list[Any] = [None]
    dist.recv_object_list(box, src, group=control)
    meta = box[0]
    names = list(meta["shapes"])
    received: dict[str, Tensor] = {}
    for name in names[:1] if meta["tied"] else names:
        shape, dtype = meta["shapes"][name]
        received[name] = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(received[name], src)
    if meta["tied"]:
        received[names[1]] = received[names[0]]
    return received, int(meta["mask_token_id"]), meta["data"]


@dataclass
class _Slot:
    header: Tensor
    payload: list[Tensor]


@dataclass
class Received:
    header: dict[str, float]
    input_ids: Tensor
    loss_mask: Tensor  # bool
    features: Tensor


class FeatureReceiver:
    """The drafter's end: depth + 1 buffer sets, receives for the next `depth` batches posted.

    A batch taken stays valid until the credit after next: its buffer set is reused by the
    receive that credit posts, once the step that used it has finished.
    """

    def __init__(
        self, src: int, shape: WireShape, device: torch.device, depth: int, control: Any
    ) -> None:
        self.src = src
        self.control = control
        self.slots = [
            _Slot(torch.empty(len(HEADER_FIELDS), dtype=torch.float64), shape.empty_payload(device))
            for _ in range(depth + 1)
        ]
        self.pending: deque[tuple[_Slot, dist.Work, list[dist.Work]]] = deque()
        self.posted = 0
        self.taken = 0
        for _ in range(depth):
            self._post()

    def _post(self) -> None:
        slot = self.slots[self.posted % len(self.slots)]
        header = dist.irecv(slot.header, self.src, group=self.control)
        payload = [dist.irecv(t, self.src) for t in slot.payload]
        assert header is not None and all(w is not None for w in payload)
        self.pending.append((slot, header, payload))  # type: ignore[arg-type]
        self.posted += 1

    def take(self) -> Received:
        """The next batch: blocks for its header; on a GPU the stream waits for the payload."""
        slot, header_work, payload_works = self.pending.popleft()
        header_work.wait()
        for work in payload_works:
            work.wait()
        header = dict(zip(HEADER_FIELDS, slot.header.tolist(), strict=True))
        if int(header["seq"]) != self.taken:
            raise RuntimeError(
                f"feature stream from rank {self.src}: got batch {int(header['seq'])}, "
                f"expected {self.taken}"
            )
        self.taken += 1
        ids, mask, features = slot.payload
        return Received(header, ids, mask.bool(), features)

    def credit(self, more: bool) -> None:
        """Post the receive of one more batch and tell the target so, or tell it to stop."""
        if more:
            self._post()
        dist.send(torch.tensor([1.0 if more else 0.0]), self.src, group=self.control)

    def drain(self) -> None:
        """After the stop credit: take what the target had already sent."""
        while self.pending:
            self.take()
