"""The dashboard's sweep pages: a tenant's sweeps, and one sweep with its trials (read as ``GetSweep`` reads them)."""

from __future__ import annotations

from dataclasses import dataclass

import optuna

from cantata.proto.v1 import sweeps_pb2
from cantata.server.services.sweeps import sweep_info, trials
from cantata.server.sweeps.store import SweepStore


@dataclass(frozen=True)
class SweepViews:
    sweeps: SweepStore
    storage: optuna.storages.BaseStorage

    def list(self, tenant: str) -> list[sweeps_pb2.SweepInfo]:
        return [sweep_info(s) for s in self.sweeps.sweeps(tenant)]

    def detail(self, sweep_id: str, tenant: str) -> sweeps_pb2.SweepInfo:
        """The tenant's sweep with its trials, best first among the completed; another's is not found."""
        sweep = self.sweeps.sweep(sweep_id, tenant=tenant)
        info = sweep_info(sweep, trials(self.storage, sweep.id))
        ordered = sorted(info.trials, key=lambda t: (t.state != "COMPLETE", t.value, t.number))
        del info.trials[:]
        info.trials.extend(ordered)
        return info


def state_name(state: int) -> str:
    return sweeps_pb2.SweepState.Name(state).removeprefix("SWEEP_")
