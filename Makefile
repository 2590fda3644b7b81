# The course's commands. `make course` and `make test` are the two in the README.
VENV ?= .venv
PY := $(VENV)/bin/python
SMOKE ?= 0
SEED ?= 0
PORT ?= 8888

.PHONY: setup course course-check test lab tensorboard clean help assessment

help:
	@echo "make setup   create $(VENV) with the pinned stack and Horovod (idempotent)"
	@echo "make course  execute every notebook headless (SMOKE=1 for the quick setting; SEED=n)"
	@echo "make course-check  every notebook in the full setting for seeds 0 and 1 (SEEDS=...), one table"
	@echo "make test    run the test suite (unit tests, real Horovod workers, notebooks in smoke mode)"
	@echo "make lab     open JupyterLab on your copies of the labs in lab/ (exercises to fill in; PORT=$(PORT))"
	@echo "make tensorboard  open TensorBoard on build/profile (profiler traces from the labs)"
	@echo "make assessment  build the two assessments' release versions (assignments/release/)"

setup:
	@VENV=$(VENV) bash scripts/setup.sh

course: setup
	$(PY) -m mgpu.runtime.course $(if $(filter 1 true yes,$(SMOKE)),--smoke) --seed $(SEED)

course-check: setup
	$(PY) -m mgpu.runtime.course --check --seeds $(or $(SEEDS),0 1)

test: setup
	$(PY) -m pytest --durations=25

# Your copies of the labs (solutions removed by nbgrader), written once: your work is never overwritten.
lab: setup
	$(PY) -m mgpu.runtime.labs
	$(VENV)/bin/jupyter lab --notebook-dir=lab --port=$(PORT) $(if $(filter 0,$(shell id -u)),--allow-root)

tensorboard: setup
	$(VENV)/bin/tensorboard --logdir build/profile --port 6006 --bind_all

clean:
	rm -rf build

# The assessment's release version (nbgrader generate_assignment): solutions and hidden tests removed.
assessment: setup
	cd assignments && for a in assessment zero1; do \
	  PATH=$(abspath $(VENV))/bin:$$PATH $(abspath $(PY)) -m nbgrader generate_assignment $$a --force --create || exit 1; done
