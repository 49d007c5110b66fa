"""Two held-out conformance sets no rule of targets/support_rules.py was written from (issue 41).

**new** -- the node tests a newer onnx added.  onnx 1.19.1 is installed here and every node-test run and rule
so far was read from its tests; onnx 1.23.2 (on the package registry) defines 269 node tests 1.19.1 does not
have.  Its wheel ships no node data, so its own generator (``onnx.backend.test.cmd_tools.generate_data`` over
``onnx.backend.test.case.node.collect_testcases``) writes them in a throw-away venv, and only the tests the
installed onnx does not have are kept, unchanged: their models as onnx 1.23.2 writes them (many at opsets the
runtimes here do not have yet -- inspect should say no -- a few of old ops: MatMul broadcasting, the
bidirectional and reversed RNN/GRU/LSTM, Scan-9, windowed Attention), the reference implementation's outputs
as the spec.

**zoo** -- the classic ONNX model zoo CNNs onnx ships as "light" models (bvlc_alexnet, densenet121,
inception_v1/v2, resnet50, shufflenet, squeezenet, vgg19, zfnet512): the zoo's own graphs at opset 9 and IR 3,
the caffe2-era form users still bring (initializers also listed as graph inputs, ``Sum``, ``LRN``, ``Dropout``,
batch norm unrolled to Mul/Add).  onnx replaced their weights with ``ConstantOfShape`` nodes to ship them
small; here each becomes an initializer again (a real model's form) with seeded values of the right kind
(He-scaled convolution and Gemm weights, positive batch-norm scale and variance), the input is a real photo
(skimage's astronaut) and the spec is ONNX Runtime running the file itself with every optimization off.

Written as onnx's backend tests are (``<root>/<set>/<test>/model.onnx`` and
``test_data_set_0/{input,output}_N.pb``), so ``bench_conformance.py --suite new|zoo`` runs them as the others.

    .venv/bin/python bench/onnx_new_suite.py            # writes /tmp/edgeopt-onnx-new/suite/{node,zoo}
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

WORK = Path("/tmp/edgeopt-onnx-new")
NEWER_ONNX = "onnx==1.23.2"

_GENERATE = """
import argparse, sys
import onnx.backend.test.cmd_tools as tools
import onnx.backend.test.case.node as node
tools.model_test.collect_testcases = node.collect_testcases  # the generator writes the model tests; ask for node
tools.generate_data(argparse.Namespace(output=sys.argv[1]))
"""


def newer_onnx_python(work: Path) -> Path:
    """A throw-away venv with the newer onnx (made once)."""
    py = work / "onnxenv" / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(py.parents[1])], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", NEWER_ONNX, "numpy"], check=True)
    return py


def new_node_tests(work: Path) -> Path:
    """``<work>/suite/node``: the node tests of the newer onnx that the installed one does not have."""
    import onnx

    gen = work / "generated"
    if not (gen / "node").is_dir():
        subprocess.run([str(newer_onnx_python(work)), "-c", _GENERATE, str(gen)], check=True,
                       stderr=subprocess.DEVNULL)
    have = {d.name for d in (Path(onnx.__file__).parent / "backend" / "test" / "data" / "node").iterdir()}
    out = work / "suite" / "node"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    kept = 0
    for d in sorted((gen / "node").iterdir()):
        if d.name not in have:
            shutil.copytree(d, out / d.name)
            kept += 1
    print(f"new: {kept} node tests onnx {onnx.__version__} does not have", file=sys.stderr)
    return out


def _seeded(shape: tuple[int, ...], use: tuple[str, int], rng) -> object:
    """A seeded value for a weight of ``shape`` feeding input ``use[1]`` of a ``use[0]`` node."""
    import numpy as np

    op, slot = use
    if op in ("Conv", "Gemm") and slot == 1 and len(shape) >= 2:
        fan_in = int(np.prod(shape[1:])) if op == "Conv" else int(shape[1] if len(shape) == 2 else shape[0])
        return (rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))).astype(np.float32)
    if (op == "BatchNormalization" and slot in (1, 4)) or op == "Mul":  # scale, variance, an unrolled scale
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    return (rng.standard_normal(shape) * 0.05).astype(np.float32)  # biases, means, shifts


def zoo_model(src: Path, seed: int):
    """The light zoo model at ``src`` with every ``ConstantOfShape`` weight an initializer of seeded values (and,
    IR 3, listed as a graph input as the zoo's files list theirs)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(src))
    g = m.graph
    rng = np.random.default_rng(seed)
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    for n in g.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    uses: dict[str, tuple[str, int]] = {}
    for n in g.node:
        for k, name in enumerate(n.input):
            uses.setdefault(name, (n.op_type, k))
    made, keep = [], []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in consts:
            shape = tuple(int(s) for s in consts[n.input[0]])
            use = uses.get(n.output[0], ("", 0))
            if use[0] == "Unsqueeze":  # densenet/inception_v2: a per-channel scale or shift, unsqueezed then used
                after = next(x for x in g.node if n.output[0] in x.input).output[0]
                use = uses.get(after, use)
            made.append(numpy_helper.from_array(_seeded(shape, use, rng), n.output[0]))
        else:
            keep.append(n)
    del g.node[:]
    g.node.extend(keep)
    used = {name for n in g.node for name in n.input}
    live = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(live + made)
    feeds = [i for i in g.input if i.name not in consts and i.name in used]
    listed = {i.name for i in feeds}
    del g.input[:]
    g.input.extend(feeds)
    if m.ir_version < 4:  # IR 3 lists every initializer as a graph input too, as the zoo's files do
        for t in g.initializer:
            if t.name not in listed:
                g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    onnx.checker.check_model(m)
    return m


def set_batchnorm_stats(m, x) -> None:
    """Each BatchNormalization's mean and variance set, in graph order, to its input's per-channel statistics on
    ``x`` (as the torchvision set does): with seeded ones activations explode with depth (resnet50's softmax
    one-hot), which no trained model shows."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    inits = {t.name: t for t in m.graph.initializer}
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    feed = next(i.name for i in m.graph.input if i.name not in inits)
    for n in [n for n in m.graph.node if n.op_type == "BatchNormalization"]:
        probe = onnx.ModelProto()
        probe.CopyFrom(m)
        del probe.graph.output[:]
        probe.graph.output.append(onnx.helper.make_tensor_value_info(n.input[0], onnx.TensorProto.FLOAT, None))
        a = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(
            None, {feed: x})[0]
        axes = tuple(i for i in range(a.ndim) if i != 1)
        for name, v in ((n.input[3], a.mean(axis=axes)), (n.input[4], a.var(axis=axes) + 1e-3)):
            inits[name].CopyFrom(numpy_helper.from_array(v.astype(np.float32), name))


def zoo_tests(work: Path) -> Path:
    """``<work>/suite/zoo``: the light zoo models in a real model's form, a photo in, ONNX Runtime's plain run
    of each file as the spec."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper
    from skimage import data as photos
    from skimage.transform import resize

    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    out = work / "suite" / "zoo"
    shutil.rmtree(out, ignore_errors=True)
    img = resize(photos.astronaut(), (224, 224), anti_aliasing=True).astype(np.float32)
    x = ((img - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).transpose(2, 0, 1)[None].astype(np.float32)
    for i, src in enumerate(sorted(light.glob("light_*.onnx"))):
        name = "test_" + src.stem.removeprefix("light_")
        m = zoo_model(src, seed=i)
        set_batchnorm_stats(m, x)
        d = out / name
        (d / "test_data_set_0").mkdir(parents=True)
        onnx.save(m, str(d / "model.onnx"))
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(str(d / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        feed = sess.get_inputs()[0].name
        (d / "test_data_set_0" / "input_0.pb").write_bytes(numpy_helper.from_array(x, feed).SerializeToString())
        for k, (o, y) in enumerate(zip(sess.get_outputs(), sess.run(None, {feed: x}))):
            (d / "test_data_set_0" / f"output_{k}.pb").write_bytes(
                numpy_helper.from_array(y, o.name).SerializeToString())
        print(f"zoo: {name} ({len(m.graph.node)} nodes, top class {int(np.argmax(y))})", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=str(WORK))
    ap.add_argument("--sets", default="new,zoo", help="which sets to write: new, zoo")
    a = ap.parse_args()
    work = Path(a.work)
    sets = set(a.sets.split(","))
    if "new" in sets:
        new_node_tests(work)
    if "zoo" in sets:
        zoo_tests(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
