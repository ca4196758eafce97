"""Development control plane for agentflows: real etcd, kube-apiserver and kube-controller-manager.

Used by ``hack/control-plane`` (the command line) and by ``tests/cluster/conftest.py`` (the
pytest fixtures); both drive the same code. There is no container runtime: a small Python
"process kubelet" (:mod:`devcluster.kubelet`) registers a Node and runs each pod's containers as
local processes. Modules:

- :mod:`devcluster.build` builds and caches the pinned Kubernetes and etcd binaries.
- :mod:`devcluster.pki` makes the CA, serving certificates and service-account keys.
- :mod:`devcluster.controlplane` starts, waits for and stops the processes.
- :mod:`devcluster.kubelet` is the process kubelet.
- :mod:`devcluster.cli` is the ``hack/control-plane`` command line.
"""
