"""The course's runtime: what the lessons, the tests, the assessment and the grader share.

- ``_worker``       the program each Horovod worker runs for ``launch``
- ``accelerator``   the simulated accelerator: a modelled device per worker where GPUs are fewer than workers
- ``callbacks``     Keras callbacks shared by the labs and the assessment (throughput, time, targets)
- ``colab``         the Colab badges, every notebook's first cell, and the course's setup inside Colab
- ``collectives``   what a worker hands to Horovod's collectives, recorded (the bytes 07 and 08 count)
- ``course``        executing the notebooks headless with papermill
- ``data``          dataset registry, cache, ``auto`` choice and fingerprints
- ``download``      fetching official dataset files with SHA-256 checks, atomically and resumably
- ``hardware``      what this machine has and which hardware profile the course uses
- ``horovod_build`` building Horovod 0.28.1 with the course's patches into a cached wheel
- ``labs``          the learner's copies of the labs, exercise solutions removed (nbgrader)
- ``launch``        running a function or script on N data-parallel Horovod workers
- ``measure``       the benchmark harness (warm-up, repetitions, median) and FLOP counts
- ``models``        small Keras models (CNN, MLP, ResNet-style) for the labs
- ``paths``         where the checkout, the build folder and its parts are
- ``plotting``      the figures' shared style helpers, and any figure two or more notebooks call
- ``reference``     measurements on a real GPU (H100) shown where the machine has none
- ``results``       each notebook's headline numbers (``build/results``) and figures
- ``saved``         the notebooks' ``#@save`` cells written into ``mgpu/lessonNN/saved.py``: the code a lesson teaches, once
- ``synthetic``     the offline default dataset, generated deterministically
- ``tables``        tables of measurements a notebook shows as a value
- ``timeline``      reading Horovod's timeline

Here is what several lessons, the tests, the assessment or the grader share: nothing in it is one
lesson's subject. ``plotting`` holds the figures' shared style helpers and any figure two or more
notebooks call (``results.save_figure`` saves them all). A module here may import a lesson's module
lazily where a lesson's subject is also a runtime feature (``launch.run(hosts=...)`` checks hosts
with :mod:`mgpu.lesson10.multinode`).
"""
