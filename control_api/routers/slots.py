"""``/steer/slots``: the engine's slot table as the mailbox shows it, for operators."""

from __future__ import annotations

from datetime import datetime, timezone

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from hotwire.shared.mailbox import ANY_LAYER, STATE_NAMES

from ..dependencies import ServicesDep, require_reader
from ..errors import ApiError, responses
from ..slots import EngineView

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


class SlotTable(BaseModel):
    engine: EngineInfo
    n_slots: int
    used: int
    slots: list[SlotInfo]


@router.get("", response_model=SlotTable, dependencies=[Depends(require_reader)],
            responses=responses(401, 503))
async def slot_table(svc: ServicesDep) -> SlotTable:
    view = svc.slots.view()
    if view is None:
        raise ApiError(503, "no_engine", f"no engine attached ({svc.slots.link.problem})")
    return _table(view)


def _table(view: EngineView) -> SlotTable:
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
    return SlotTable(engine=engine, n_slots=view.table.n_slots, used=view.table.used, slots=slots)
