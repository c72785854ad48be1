"""No module asks which model family or which objective it is dealing with, except that family's or objective's own
modules and the registries: everything else goes through the seams (models/family.py, train/objectives/,
checkpoints/formats.py). Like tests/test_import_layers.py for the layers, this reads the package's source.

What counts as naming one:
- an objective or its evaluator by name, as a string literal ("mae", "reconstruction", ...);
- a family by its config class or helpers (BiTConfig, is_bit_name, ...), or a type test against a family's config
  (`isinstance(cfg, ViTConfig)`).
"""

import ast
import pathlib
import re

import vit_jax

PACKAGE = pathlib.Path(vit_jax.__file__).parent

# Everywhere: the registries, and the training config's defaults (a default objective and evaluator must be named).
REGISTRIES = {"train/objectives/__init__.py", "train/objectives/registry.py", "train/objectives/base.py",
              "models/family.py", "models/build.py", "checkpoints/formats.py", "checkpoints/loading.py",
              "train/config.py"}

OBJECTIVES = {  # name and evaluator -> the objective's own modules
    ("classification",): {"train/objectives/classification.py"},
    ("mae", "reconstruction"): {"train/objectives/mae.py", "models/mae.py"},
    ("dino",): {"train/objectives/dino.py", "models/dino.py"},
    ("masked_patch_prediction", "masked_patch"): {"train/objectives/mpp.py", "train/objectives/mae.py",
                                                   "models/mpp.py"},  # mpp.py shares MAE's fixed eval key
    # "segmentation" is also the data contract's name of a per-pixel label map (docs/data.md): the pipeline's ops
    # that move it with the image and the dataset that stores it read that field, not the objective.
    ("segmentation",): {"train/objectives/segmentation.py", "models/segmentation.py", "eval/segmentation.py",
                        "data/image_ops.py", "data/randaug.py", "data/digits_mosaic.py"},
}

FAMILIES = {  # identifiers of a family -> its own modules (model, config, registration, checkpoint formats)
    r"\bBiTConfig\b|\bis_bit_name\b|\bparse_bit_name\b|\bbit_config\b|\bcheckpoints\.bit\b|\bbit_flops\b": {
        "models/bit.py", "models/bit_config.py", "models/bit_family.py", "checkpoints/bit.py", "models/flops.py"},
    r"isinstance\([^)]*ViTConfig": set(),
}


def sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in PACKAGE.rglob("*.py")}


def string_literals(text: str) -> set[str]:
    """Every string constant of the code (docstrings and comments are prose, not dispatch: left out)."""
    tree = ast.parse(text)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}


def code_without_prose(text: str) -> str:
    """The source with comments and string constants blanked (identifiers and calls left)."""
    return re.sub(r"#.*", "", re.sub(r'("""|\'\'\')(.|\n)*?\1|"[^"\n]*"|\'[^\'\n]*\'', '""', text))


def test_objective_names_live_in_their_objectives_modules():
    bad = []
    for path, text in sources().items():
        if path in REGISTRIES:
            continue
        literals = string_literals(text)
        for names, owners in OBJECTIVES.items():
            # the name as a string, or quoted inside one (`objective='mae'` in a message, an f-string's fixed part)
            hits = [n for n in names if n in literals or any(f"'{n}'" in s for s in literals)]
            if hits and path not in owners:
                bad.append(f"vit_jax/{path}: {hits}")
    assert not bad, "objective names outside their own modules and the registries:\n" + "\n".join(bad)


def test_family_names_live_in_their_families_modules():
    bad = []
    for path, text in sources().items():
        if path in REGISTRIES:
            continue
        code = code_without_prose(text)
        for pattern, owners in FAMILIES.items():
            if path not in owners and re.search(pattern, code):
                bad.append(f"vit_jax/{path}: {re.search(pattern, code).group(0)}")
    assert not bad, "model families named outside their own modules and the registries:\n" + "\n".join(bad)


def test_the_checks_see_a_name_where_it_does_not_belong():
    assert "mae" in string_literals('if c.objective == "mae":\n    pass\n')
    assert "mae" not in string_literals('"""An MAE module: objective "mae"."""\nx = 1\n')
    assert re.search(list(FAMILIES)[0], code_without_prose("if isinstance(cfg, BiTConfig):  # x\n    pass\n"))
    assert not re.search(list(FAMILIES)[0], code_without_prose('x = 1  # BiTConfig\ny = "BiTConfig"\n'))
