"""mgpu: the library behind the course "Deep learning on multiple GPUs".

The notebooks stay narrative; the code they call lives here, one module per concern:

- ``mgpu.download``  fetching official dataset files with SHA-256 checks, atomically and resumably
- ``mgpu.synthetic`` the offline default dataset, generated deterministically
- ``mgpu.data``      dataset registry, cache, ``auto`` choice and fingerprints
- ``mgpu.launch``    running a function or script on N data-parallel Horovod workers
- ``mgpu.hardware``  what this machine has and which hardware profile the course uses
"""

import os as _os

# TensorFlow's C++ INFO lines (CPU feature notes) only clutter notebook cells and test logs;
# warnings and errors still show. Set TF_CPP_MIN_LOG_LEVEL=0 to see everything.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

__version__ = "0.1.0"
