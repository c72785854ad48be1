"""vit_jax: pretraining and fine-tuning Vision Transformers in JAX/Flax at scale."""
import re
from pathlib import Path

from setuptools import Extension, find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"', Path("vit_jax/__init__.py").read_text()).group(1)

# Ranges are the versions this code is tested with (see GUIDE traps: the APIs of jax/flax/orbax move fast).
INSTALL_REQUIRES = [
    "jax>=0.10.2,<0.11",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "tensorflow-datasets>=4.9.10,<4.10",
    "array-record>=0.8.6",
    "grain>=0.2.18,<0.3",
    "portpicker>=1.6",  # grain 0.2.x imports it
    "ml-collections>=1.1,<2",
    # TFDS's dataset builders run on TensorFlow; a training run never imports it (see train/tb_events.py).
    "tensorflow-cpu>=2.21,<2.22",
    "tensorboard>=2.21,<3",  # its event protos: train/tb_events.py writes the events itself
    "google-crc32c>=1.5",  # TFRecord framing of the event files
    "numpy>=2.0,<3",
    # jax's low-precision dtypes. 0.7.0 registers its dtypes' numpy ufunc loops at import for ~0.57 s of CPU (0.6.0:
    # 4 ms; numpy 2.3 and 2.4 alike), which every vit-jax process pays: a tiny 40-step training run took 7.3 s of CPU
    # with it against 6.5 s with 0.6.0 (4 paired runs each, 2026-12-06, Intel Xeon @ 2.80GHz). jax needs >= 0.5.
    "ml-dtypes>=0.5,<0.7",
    "pillow>=10",
    "opencv-python-headless>=4.11",  # fast resize (PIL's is ~10x slower); 4.11 is the first with cv2.IMREAD_COLOR_RGB
    "safetensors>=0.4",
    "matplotlib>=3.8",
    "scikit-learn>=1.4",  # ships the embedded default dataset (handwritten digits)
    "sentencepiece>=0.2,<0.3",  # image-text tokenizers: by path, and the demo's trained from its captions (data/text_ops.py)
    "scipy>=1.11",  # bounded least squares of the sweep report's scaling-law fits (vit_jax/report/scaling.py)
    "tqdm>=4.60",
    "absl-py>=2.0",
    # gs:// datasets, workdirs and checkpoints: etils.epath and our transfers go through fsspec's gcsfs (never
    # tf.io.gfile, which cannot reach an emulator; see vit_jax/runtime.py). Pods need it, so it is not optional.
    "gcsfs>=2026.9,<2027",
]

# The cropped JPEG decode of the input pipeline (vit_jax/data/_jpeg_crop.c) calls libjpeg-turbo's partial-decode API
# (jpeg_crop_scanline, jpeg_skip_scanlines, libjpeg-turbo >= 1.5): it builds against the system's libjpeg headers
# and library (libjpeg-dev: Debian's libjpeg62-turbo-dev, Ubuntu's libjpeg-turbo8-dev; the Makefile installs it when
# it is missing).
JPEG_CROP = Extension("vit_jax.data._jpeg_crop", ["vit_jax/data/_jpeg_crop.c"], libraries=["jpeg"],
                      extra_compile_args=["-O2"])


def _jaxlib_include() -> str:
    import jaxlib  # a build requirement (pyproject.toml)

    return str(Path(jaxlib.__file__).parent / "include")


# The CPU attention kernel (vit_jax/models/_attention_cpu.cc, see vit_jax/models/attention_cpu.py): an XLA FFI handler
# in C++ against jaxlib's FFI headers, compiled for this machine's vector instructions (it refuses to load on a CPU
# that lacks them, and attention then stays on XLA's ops).
ATTENTION_CPU = Extension("vit_jax.models._attention_cpu", ["vit_jax/models/_attention_cpu.cc"],
                          include_dirs=[_jaxlib_include()], language="c++",
                          extra_compile_args=["-O3", "-march=native", "-std=c++17", "-Wno-return-type"])

setup(
    name="vit_jax",
    version=VERSION,
    description="Vision Transformers in JAX/Flax: pretraining, fine-tuning, checkpoints, sweeps.",
    long_description=Path("README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["vit_jax", "vit_jax.*"]),
    package_data={"vit_jax": ["resources/*", "resources/**/*"]},
    ext_modules=[JPEG_CROP, ATTENTION_CPU],
    install_requires=INSTALL_REQUIRES,
    extras_require={
        # jax[tpu] brings libtpu (0.0.42.x for jax 0.10.2): the TPU compiler that `vit-jax plan --topology` and the
        # pod launcher's --preflight use on machines without a TPU, and that the tests exercise (684 MB).
        # gcp-storage-emulator: the GCS API server on localhost that tests/storage and `bench data --remote` use.
        # pytest-xdist: `make test` runs the suite on two workers (tests/conftest.py groups the files).
        "test": ["pytest>=8", "pytest-timeout>=2.2", "pytest-xdist>=3.6", "jax[tpu]>=0.10.2,<0.11",
                 "gcp-storage-emulator>=2026.7"],
        # interop: the oracles of the tests that compare with another framework (timm's ResNetV2 for BiT, timm's ViT
        # for `bench --compare timm`); `make test` installs it. torch is pinned: 2.13.0 resolves to the CPU build
        # where pip finds that wheel (this project's machines keep it in pip's find-links), while a range admitting a
        # newer release takes a CUDA build of several GB. timm imports torchvision, whose x86-64 wheels are built
        # against CUDA torch: vit_jax/bench/timm_import.py lets it import beside the CPU build. timm is pinned to the
        # release the oracle tests were written against; transformers (ViViT, the video family's oracle) likewise.
        "interop": ["torch==2.13.0", "torchvision==0.28.0", "timm==1.0.29", "transformers==5.25.0",
                    "open_clip_torch==3.3.0"],  # open_clip: its big_vision loader reads our SigLIP .npz (#42)
        "gpu": ["jax[cuda12]>=0.10.2,<0.11"],
        "tpu": ["jax[tpu]>=0.10.2,<0.11"],
    },
    entry_points={"console_scripts": ["vit-jax=vit_jax.cli:main"]},
)
