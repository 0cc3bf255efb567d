"""What a starting gateway does for the runs of gateways that died mid-run (issue 10, item 4).

Every process of a run is dead by the deadline its record carries (the sandbox's watchdog,
sandbox/backends/pidns.py: the run's time limit plus a grace), so a record still `running` past
it can only belong to a gateway that was killed or crashed. Such a run is closed as `abandoned`
with its terminal audit event (TOOL_FINISHED, `reason: gateway_lost`). Its budget charge is the
reservation it took at admission, its whole time limit (gateway/budget.py): a run whose end
nobody saw is charged as if it used all of it. The scratch folders such runs left are removed
(sandbox/leftovers.py).
"""

from __future__ import annotations

import logging

from gateway.audit import EventDraft, EventType
from gateway.services import Services
from sandbox.leftovers import sweep_scratch

log = logging.getLogger("gateway.recovery")


def close_abandoned_runs(services: Services) -> list[str]:
    """Close the stale `running` records and log their end; the ids closed, by this gateway only."""
    closed = services.runs.close_abandoned(services.clock.now())
    for record in closed:
        services.audit.append(
            EventDraft(
                EventType.TOOL_FINISHED,
                run_id=record.run_id,
                user=record.user,
                workspace=record.workspace,
                tool_name=record.tool_name,
                detail={"status": "abandoned", "reason": "gateway_lost"},
            )
        )
        log.warning(
            "run %s (%s, workspace %s) was left running by a gateway that died; closed as abandoned",
            record.run_id,
            record.user,
            record.workspace,
        )
    for folder in sweep_scratch():
        log.warning("removed %s, the scratch folder of a run whose gateway died", folder)
    return [record.run_id for record in closed]
