"""The node agent: registers its Node, runs the pods bound to it, reports their status.

* `config`  — `AgentConfig` and building the API client from it;
* `node`    — Node registration, conditions, Lease heartbeats, pod CIDR;
* `sync`    — the pod watch and one `PodWorker` per pod; recovery after a restart;
* `worker`  — one pod's lifecycle through the runtime driver (state diagram there);
* `status`  — pod phase, conditions and container statuses (pure);
* `volumes` — a pod's volumes on the node; claimed ones (persistentVolumeClaim,
  ephemeral) through `csivolumes` (stage/publish via the storage drivers, restart
  records, expansion, CSINode, volume stats) and its pure rules in `csiplan`;
* `run`     — `run(cfg)`, the agent as one Trio service.
"""
