"""Which namespaces an operator reconciles (its shard, its --namespace list), and the flags of
``agentflows operator`` for shards and leader election refused with a clear message.

The operator on a cluster with these flags is tested in tests/cluster/test_operator_leader.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from agentflows.cli import main as cli
from agentflows.controller import settings

NAMES = [f"team-{i}" for i in range(300)] + ["default", "kube-system", "agentflows-system"]


def owners(namespace: str, shard_count: int) -> list[int]:
    """The shard indexes whose operator owns ``namespace``."""
    return [
        index
        for index in range(shard_count)
        if settings.OperatorConfig(shard_index=index, shard_count=shard_count).owns(namespace)
    ]


@pytest.mark.parametrize("shard_count", [1, 2, 3, 7])
def test_every_namespace_belongs_to_exactly_one_shard(shard_count: int) -> None:
    assert all(len(owners(name, shard_count)) == 1 for name in NAMES)


def test_shards_split_namespaces_roughly_evenly() -> None:
    sizes = [sum(owners(name, 3) == [index] for name in NAMES) for index in range(3)]
    assert min(sizes) > len(NAMES) / 3 * 0.7, sizes


def test_a_namespace_keeps_its_shard_in_every_process_whatever_the_hash_seed() -> None:
    script = "from agentflows.controller import settings; import sys; " + (
        "print([settings.shard_of(n, 5) for n in sys.argv[1:]])"
    )
    printed = {
        subprocess.run(
            [sys.executable, "-c", script, *NAMES[:50]],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert printed == {f"{[settings.shard_of(n, 5) for n in NAMES[:50]]}\n"}


def test_the_shard_is_crc32_of_the_name_modulo_the_count_as_the_docs_say() -> None:
    # the values docs/operator-scaling.md's one-liner prints: pinned, so they never move
    names = ("team-a", "team-b", "team-c", "team-d", "team-e")
    assert [settings.shard_of(name, 3) for name in names] == [1, 2, 1, 0, 1]


def test_named_namespaces_combine_with_shards() -> None:
    named = ("team-a", "team-b", "team-d")
    owned = {
        index: [
            name
            for name in ("team-a", "team-b", "team-c", "team-d", "team-e")
            if settings.OperatorConfig(namespaces=named, shard_index=index, shard_count=2).owns(
                name
            )
        ]
        for index in (0, 1)
    }
    assert owned == {0: ["team-d"], 1: ["team-a", "team-b"]}


def operator(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli.main, ["operator", *args])
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--shard-index", "2", "--shard-count", "2"],
            "error: --shard-index 2: with --shard-count 2 it must be from 0 to 1\n",
        ),
        (
            ["--shard-index", "-1", "--shard-count", "3"],
            "error: --shard-index -1: with --shard-count 3 it must be from 0 to 2\n",
        ),
        (
            ["--shard-index", "1"],
            "error: --shard-index 1: with --shard-count 1 it must be from 0 to 0\n",
        ),
        (["--shard-count", "0"], "error: --shard-count 0: must be 1 or more\n"),
        (
            ["--lease-name", "Operator_Lease"],
            'error: --lease-name: "Operator_Lease" is not a valid name: lower-case letters,'
            ' digits, "-" and ".", starting and ending with a letter or digit, at most 253'
            " characters\n",
        ),
        (
            ["--leader-election-namespace", "Team A"],
            'error: --leader-election-namespace: "Team A" is not a valid name:',
        ),
    ],
)
def test_a_bad_shard_or_lease_flag_is_refused_with_exit_2_and_what_is_valid(
    args: list[str], message: str
) -> None:
    code, stderr = operator(*args)
    assert code == 2
    assert stderr.startswith(message), stderr


def test_leader_elect_takes_a_boolean_value_and_refuses_anything_else() -> None:
    code, stderr = operator("--leader-elect=maybe")
    assert code == 2
    assert "Invalid value for '--leader-elect': 'maybe' is not a valid boolean" in stderr


def test_the_lease_of_a_shard_is_named_after_it() -> None:
    assert settings.lease_name("agentflows-operator", 0, 1) == "agentflows-operator"
    assert settings.lease_name("agentflows-operator", 2, 3) == "agentflows-operator-shard-2"


def test_a_replica_is_named_on_the_lease_by_its_pod_else_host_and_pid() -> None:
    assert settings.identity_from_env({"POD_NAME": "agentflows-operator-7d9f-x2x"}) == (
        "agentflows-operator-7d9f-x2x"
    )
    assert settings.identity_from_env({}).endswith(f"_{os.getpid()}")
