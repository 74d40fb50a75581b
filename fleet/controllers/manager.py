"""The controller manager: which controllers `fleet server` runs (in one nursery).

Each controller is a class following `fleet.controllers.runtime.Controller`; the
list below is the whole set.  The manager is one task of the server; with several
servers it is the part that will run only on the lease holder.
"""

from __future__ import annotations

from fleet.controllers.runtime import Controller, Manager


def default_controllers() -> list[Controller]:
    from fleet.controllers.serviceaccount import ServiceAccountController

    return [
        ServiceAccountController(),
    ]


def default_manager() -> Manager:
    return Manager(default_controllers())
