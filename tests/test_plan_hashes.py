"""Plan hashes, canonical forms and task config hashes are part of every store: a store refuses rows of
another plan, and a resumed sweep reuses a row only when its task's config hash matches. The values below
were computed with the code before the probes moved into one module each (issue #34, main at ab31e67);
they must not change unless the CHANGELOG says why."""

from __future__ import annotations

import hashlib
import json

from losslens.study.sweep.plan import Plan


def _plans():
    from losslens.study.sweep import AccuracyProbe, BlockTraceProbe, DataSpec, EigenProbe, ExplainProbe, TraceProbe

    return {
        "default": Plan.default(),
        "default_quick": Plan.default(quick=True),
        "loss_only": Plan(),
        "everything": Plan(
            quant=("rtn:3", "gptq:4"),
            trace=TraceProbe("hutchinson", 20),
            eigen=EigenProbe(k=2, method="power", tol=1e-4, max_iter=50),
            block_trace=BlockTraceProbe(groups={"attn": "*attn*", "mlp": ["*mlp*", "*fc*"]}, num_matvecs=10),
            directional=("rtn:4",),
            kurtosis=True,
            lawa=(2, 4),
            curvature_params=("*layers*",),
            quant_modules=("*proj*",),
            checkpoints=("a", "b"),
            seed=3,
            explain=ExplainProbe(specs=("rtn:4",), blocks=("layer",), within=True, trace_matvecs=9),
            max_memory="2GB",
            backend="forward",
            accuracy=AccuracyProbe(tasks=("embedded",), specs=("rtn:4",), limit=20, num_fewshot=0, seed=1, n_boot=100),
            data=DataSpec(eval=(2, 2, 16), calibration=(1, 2, 16), curvature=(1, 2, 16), seed=5),
        ),
        "block_module": Plan(loss=False, block_trace=True, eigen=True, explain=["gptq:3"]),
    }


PINNED = {
    "default": (
        "d0035c784a0d67146f54c1d85110bda3ba298591648488f0895087f3c3ef1d3a",
        "98dfe68eda889444",
        [
            ["loss", "", "297a72effec82952"],
            ["kurtosis", "", "801d137e4b482a72"],
            ["quant", "rtn:3:g128", "261b753313245e5d"],
            ["quant", "rtn:4:g128", "1df4455b17278fc8"],
            ["quant", "int8", "1de8e6429aaed3ae"],
            ["quant", "gptq:3:g128", "48e028feeae74ee5"],
            ["quant", "gptq:4:g128", "efb519cebb748097"],
            ["directional", "rtn:4:g128", "412773325473f2ef"],
            ["trace", "hutch++", "acf2f8753bebd20a"],
            ["eigen", "top1", "4dc7069dd730f232"],
        ],
    ),
    "default_quick": (
        "e2c536b8a2953ee66848338dcfcee52663999cf61d40600fc968c9e04825dab4",
        "89c59720ac54b244",
        [
            ["loss", "", "6897fb9544063be1"],
            ["kurtosis", "", "801d137e4b482a72"],
            ["quant", "rtn:3:g128", "744e29987f09f96c"],
            ["quant", "rtn:4:g128", "e58770707d1465ba"],
            ["quant", "int8", "0543a75c5098c2ab"],
            ["quant", "gptq:3:g128", "1362bd4e9b64fc81"],
            ["quant", "gptq:4:g128", "18e7e121aca7fe02"],
            ["directional", "rtn:4:g128", "7233424646be67b1"],
            ["trace", "hutch++", "fb1c720f7c2ed2a2"],
            ["eigen", "top1", "7ccda9e52af9a102"],
        ],
    ),
    "loss_only": (
        "e7600db600f8aff0c0d833b340a7d5114883df70cb847c5b405c21d1554712cd",
        "a7edd6e13a5ac16a",
        [["loss", "", "297a72effec82952"]],
    ),
    "everything": (
        "51830f3512540406262ba0305384b10dfab68702af015d3824bf73f84a374420",
        "e800b5e57f76628e",
        [
            ["loss", "", "a388936f2d2a841f"],
            ["kurtosis", "", "98b6587d0d7bc8a1"],
            ["quant", "rtn:3:g128", "78febe076212f7a3"],
            ["quant", "gptq:4:g128", "8651596c2f773e3a"],
            ["directional", "rtn:4:g128", "14ea93b9a4a3ca54"],
            ["trace", "hutchinson", "a99433d67b521f59"],
            ["eigen", "top2", "bb12cfbe82e42850"],
            ["block_trace", "custom", "0f80ac011d903a72"],
            ["explain", "rtn:4:g128", "de1ab83e77eb4e5f"],
            ["accuracy", "fp", "9e1f7e4cdbc5957c"],
            ["accuracy", "fp@losslens_pydoc_mc", "c7b2ef0ba5bbc475"],
            ["accuracy", "rtn:4:g128", "4b6c815b9159ec02"],
            ["accuracy", "rtn:4:g128@losslens_pydoc_mc", "848e29d64a2a43e8"],
        ],
    ),
    "block_module": (
        "dad43fea667c8b26b2a631bda460270009850e1c7f71c87ab02bf3e271b1b68c",
        "b16d1846934611bd",
        [
            ["eigen", "top1", "e013f9156ef8bf40"],
            ["block_trace", "block", "4cb4aefef0fd66f8"],
            ["explain", "gptq:3:g128", "8efe46f45fcaea91"],
        ],
    ),
}


def _dict_sha(plan: Plan) -> str:
    return hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def test_plan_hashes_canonical_forms_and_task_hashes_are_pinned():
    for name, plan in _plans().items():
        plan_hash, dict_sha, tasks = PINNED[name]
        assert plan.hash == plan_hash, name
        assert _dict_sha(plan) == dict_sha, name
        assert [[t.probe, t.spec, t.config_hash] for t in plan.tasks()] == tasks, name


def test_pinned_plans_round_trip_through_dict_and_json(tmp_path):
    for name, plan in _plans().items():
        again = Plan.from_dict(plan.to_dict())
        assert again == plan and again.hash == plan.hash, name
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(plan.to_dict()))
        assert Plan.from_file(path).hash == PINNED[name][0], name


def test_a_toml_plan_with_every_probe_keeps_its_hash(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text("""
name = "all"
seed = 3
lawa = [2, 4]
curvature_params = ["*layers*"]
quant_modules = ["*proj*"]
checkpoints = ["a", "b"]
max_memory = "2GB"
backend = "forward"

[data]
seed = 5
eval = [2, 2, 16]
calibration = [1, 2, 16]
curvature = [1, 2, 16]

[probes]
loss = true
quant = ["rtn:3", "gptq:4"]
trace = { method = "hutchinson", num_matvecs = 20 }
eigen = { k = 2, method = "power", tol = 1e-4, max_iter = 50 }
block_trace = { groups = { attn = "*attn*", mlp = ["*mlp*", "*fc*"] }, num_matvecs = 10 }
directional = ["rtn:4"]
kurtosis = true
explain = { specs = ["rtn:4"], blocks = ["layer"], within = true, trace_matvecs = 9 }
accuracy = { tasks = ["embedded"], specs = ["rtn:4"], limit = 20, num_fewshot = 0, seed = 1, n_boot = 100 }
""")
    assert Plan.from_file(path).hash == PINNED["everything"][0]
