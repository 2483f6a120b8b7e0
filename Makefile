# Quick start: `make demo` and `make test`; both set up whatever is missing first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EMOJI_FONT := /usr/share/fonts/truetype/noto/NotoColorEmoji.ttf
CLDR := /usr/share/unicode/cldr/common/annotations/en.xml
OPENCLIPART := /usr/share/openclipart/png
WORDNET := /usr/share/wordnet/data.noun

.PHONY: demo clipart web-demo test setup sysdeps clipart-deps browser bench lock clean

# The venv is rebuilt when pyproject.toml or the lock changes: the package with every extra ([dev] holds them all),
# at the exact versions of requirements.lock. torch==2.13.0 resolves to the CPU wheel here.
$(BIN)/.installed: pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c requirements.lock -e '.[dev]'
	# the core's wheels, for tests/test_install.py: the built wheel installs from them with no network
	$(BIN)/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > $(VENV)/core.txt
	$(BIN)/pip download --quiet -c requirements.lock -d $(VENV)/wheelhouse -r $(VENV)/core.txt
	# clip-retrieval's own ClipClient for the API test: its package imports its whole back end (torch, faiss, CLIP),
	# so it goes without dependencies into a folder of its own and the test loads clip_client.py alone
	$(BIN)/pip install --quiet --no-deps --target $(VENV)/clip-retrieval clip-retrieval==2.45.0
	touch $@

# System packages the built-in emoji corpus, the Spark engine, extract's crawler test (wget) and balance's default
# metadata (WordNet) need (Debian/Ubuntu); skipped when present or not root. The openclipart corpus's package is
# clipart-deps's (`make clipart`).
sysdeps:
	@if ! command -v java >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing default-jre-headless (for --engine spark)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null; \
	  else \
	    echo "missing Java for the Spark engine: run 'sudo apt-get install default-jre-headless'"; \
	  fi; \
	fi
	@if ! command -v wget >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing wget (a real crawler's WARC files for extract's tests)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wget >/dev/null; \
	  else \
	    echo "missing wget for extract's crawler test: run 'sudo apt-get install wget'"; \
	  fi; \
	fi
	@if [ ! -f $(EMOJI_FONT) ] || [ ! -f $(CLDR) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing fonts-noto-color-emoji unicode-cldr-core"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-noto-color-emoji unicode-cldr-core >/dev/null; \
	  else \
	    echo "missing system packages: run 'sudo apt-get install fonts-noto-color-emoji unicode-cldr-core'"; \
	  fi; \
	fi
	@if [ ! -f $(WORDNET) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing wordnet-base (balance's default metadata: WordNet's synset names)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wordnet-base >/dev/null; \
	  else \
	    echo "missing WordNet for balance's default metadata: run 'sudo apt-get install wordnet-base'"; \
	  fi; \
	fi

# openclipart-png, the images of the built-in openclipart corpus (`make clipart`, `openalign corpus openclipart`)
clipart-deps:
	@if [ ! -d $(OPENCLIPART) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing openclipart-png (the clipart preset's images)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openclipart-png >/dev/null; \
	  else \
	    echo "missing openclipart-png for the clipart preset: run 'sudo apt-get install openclipart-png'"; \
	  fi; \
	fi

# Headless Chromium for the search page's browser test (Playwright drives Debian's chromium; it never
# downloads a browser).
browser:
	@if ! command -v chromium >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium (for the search page's browser test)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else \
	    echo "missing chromium for the browser test: run 'sudo apt-get install chromium chromium-driver'"; \
	  fi; \
	fi

setup: $(BIN)/.installed sysdeps

demo: setup
	$(BIN)/openalign train --overwrite

# The next step after the demo: about an hour on 2 cores, a model that works on real clipart (docs/demo.md)
clipart: setup clipart-deps
	$(BIN)/openalign train --preset clipart --overwrite

# The whole chain offline, from a crawl of the built-in web to a trained model (docs/pipeline.md): serve, extract,
# the text rules, fetch, ingest, the image rules, dedup against the held-out split, shard, train
web-demo: setup
	$(BIN)/openalign web demo --out runs/web-demo

test: setup browser
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python bench/train_step.py

# requirements.lock anew from a venv of the package with every extra at the newest versions its ranges allow
lock:
	rm -rf /tmp/openalign-lock && $(PYTHON) -m venv /tmp/openalign-lock
	/tmp/openalign-lock/bin/pip install --quiet torch==2.13.0 && /tmp/openalign-lock/bin/pip install --quiet '.[dev]'
	{ echo "# The exact versions \`make\` installs and the suite was run with (pip install -c requirements.lock -e '.[dev]')."; \
	  echo "# Regenerate after changing pyproject.toml's dependencies: make lock"; \
	  /tmp/openalign-lock/bin/pip freeze --exclude-editable | grep -v -i -E '^(openalign|pip|setuptools|wheel)[= ]' | \
	  sed 's/+cpu$$//'; } > requirements.lock

clean:
	rm -rf runs data .pytest_cache
