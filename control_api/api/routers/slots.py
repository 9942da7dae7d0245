"""``/steer/slots``: each engine's slot table as its mailbox shows it, for operators.

The top-level fields are rank 0's table (an engine without data parallelism: its only one;
while rank 0 is detached, the lowest attached rank's, named by ``dp_rank``); ``ranks`` lists
every data-parallel rank this API feeds, detached ones included, with why. 503 only when no
rank is attached.
"""

from __future__ import annotations

from datetime import datetime, timezone

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from hotwire.shared.mailbox import ANY_LAYER, STATE_NAMES

from ...slots.engines import Engines
from ...slots.snapshot import EngineSnapshot
from ..auth import require_reader
from ..dependencies import ServicesDep
from ..http_errors import ApiError, responses

router = APIRouter(prefix="/steer/slots", tags=["slots"])


class EngineInfo(BaseModel):
    model: str
    n_layers: int
    hidden: int
    dtype: str
    epoch: str = Field(description="hex; changes when the engine restarts")
    pid: int
    heartbeat_age_s: float
    armed_layers: list[int]
    target_generation: int = Field(description="mailbox writes by the control API")
    applied_generation: int = Field(description="the last of those the engine has applied")
    in_sync: bool
    counters: dict[str, int]


class SlotInfo(BaseModel):
    slot: int
    vector_id: str
    layer: int | None = Field(description="null: serves every layer")
    state: str
    generation: int
    inflight: int = Field(description="running requests holding the slot")
    last_used: datetime | None
    pinned: bool
    startup: bool
    acked: bool = Field(description="the engine has applied this entry")


class RankTable(BaseModel):
    dp_rank: int = Field(description="data-parallel rank (0 without DP)")
    mailbox: str
    attached: bool
    problem: str | None = Field(description="why the rank is not usable now, or null")
    engine: EngineInfo | None = Field(description="null while detached")
    n_slots: int | None
    used: int | None
    slots: list[SlotInfo]


class SlotTable(BaseModel):
    dp_rank: int = Field(description="the rank the top-level fields describe")
    engine: EngineInfo
    n_slots: int
    used: int
    slots: list[SlotInfo]
    ranks: list[RankTable]


@router.get("", response_model=SlotTable, dependencies=[Depends(require_reader)],
            responses=responses(401, 503))
async def slot_table(svc: ServicesDep) -> SlotTable:
    ranks = _ranks(svc.engines)
    shown = next((r for r in ranks if r.engine is not None), None)
    if shown is None or shown.engine is None:
        why = "; ".join(r.problem if len(ranks) == 1 else f"dp rank {r.dp_rank}: {r.problem}"
                        for r in ranks)
        raise ApiError(503, "no_engine", f"no engine attached ({why})")
    return SlotTable(dp_rank=shown.dp_rank, engine=shown.engine, n_slots=shown.n_slots or 0,
                     used=shown.used or 0, slots=shown.slots, ranks=ranks)


def _ranks(engines: Engines) -> list[RankTable]:
    tables = []
    for rank in engines:
        view = rank.view()
        table = None if view is None else _table(view)
        tables.append(RankTable(
            dp_rank=rank.rank, mailbox=str(rank.link.path), attached=view is not None,
            problem=rank.engine_problem(), engine=None if table is None else table[0],
            n_slots=None if view is None else view.table.n_slots,
            used=None if view is None else view.table.used,
            slots=[] if table is None else table[1]))
    return tables


def _table(view: EngineSnapshot) -> tuple[EngineInfo, list[SlotInfo]]:
    fp = view.fingerprint
    engine = EngineInfo(model=fp.model, n_layers=fp.n_layers, hidden=fp.hidden, dtype=fp.dtype,
                        epoch=f"{view.epoch:x}", pid=view.pid, heartbeat_age_s=view.heartbeat_age_s,
                        armed_layers=list(view.armed), target_generation=view.target_gen,
                        applied_generation=view.applied_gen,
                        in_sync=view.applied_gen >= view.target_gen, counters=view.counters)
    slots = [SlotInfo(slot=u.slot, vector_id=u.vector_id,
                      layer=None if u.layer == ANY_LAYER else u.layer,
                      state=STATE_NAMES.get(u.state, str(u.state)), generation=u.generation,
                      inflight=u.inflight,
                      last_used=datetime.fromtimestamp(u.last_used_ns / 1e9, timezone.utc)
                      if u.last_used_ns else None,
                      pinned=u.pinned, startup=u.startup, acked=u.acked)
             for u in view.table.uses]
    return engine, slots
