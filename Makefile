# Quick start: `make demo` and `make test`; both set up whatever is missing first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EMOJI_FONT := /usr/share/fonts/truetype/noto/NotoColorEmoji.ttf
CLDR := /usr/share/unicode/cldr/common/annotations/en.xml
OPENCLIPART := /usr/share/openclipart/png
WORDNET := /usr/share/wordnet/data.noun
NOTO_SYMBOLS := /usr/share/fonts/truetype/noto/NotoSansSymbols2-Regular.ttf
SYMBOLA := /usr/share/fonts/truetype/ancient-scripts/Symbola_hint.ttf
UNICODE_NAMES := /usr/share/unicode/UnicodeData.txt
TUXPAINT := /usr/share/tuxpaint/stamps
ICONS := /usr/share/icons/oxygen/base
GCOMPRIS := /usr/share/gcompris-qt/rcc

.PHONY: demo clipart web-demo test setup sysdeps clipart-deps browser bench stress lock clean

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

# $(call need,TEST,PACKAGES,WHAT FOR): install the Debian PACKAGES when the shell TEST fails, as root with apt-get;
# otherwise say what to run
define need
	@if ! { $(1); }; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing $(2) ($(3))"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null; \
	  else \
	    echo "missing $(2) for $(3): run 'sudo apt-get install $(2)'"; \
	  fi; \
	fi
endef

# System packages the built-in emoji, symbols, letters and symbola corpora, the Spark engine, extract's crawler
# test (wget) and balance's default metadata (WordNet) need (Debian/Ubuntu); skipped when present or not root. The
# packages of the other real sources are clipart-deps's (`make clipart`).
sysdeps:
	$(call need,command -v java >/dev/null,default-jre-headless,the Spark engine)
	$(call need,command -v wget >/dev/null,wget,extract's crawler test)
	$(call need,[ -f $(EMOJI_FONT) ] && [ -f $(CLDR) ],fonts-noto-color-emoji unicode-cldr-core,the emoji corpus)
	$(call need,[ -f $(NOTO_SYMBOLS) ] && [ -f $(UNICODE_NAMES) ],fonts-noto-core unicode-data,the symbols corpus)
	$(call need,[ -f $(WORDNET) ],wordnet-base,balance's default metadata: WordNet's synset names)
	$(call need,[ -f $(SYMBOLA) ],fonts-symbola,the symbola corpus)

# The images of the built-in real sources openclipart, tuxpaint, icons and gcompris (`make clipart`,
# `openalign corpus NAME`)
clipart-deps:
	$(call need,[ -d $(OPENCLIPART) ],openclipart-png,the openclipart corpus)
	$(call need,[ -d $(TUXPAINT) ],tuxpaint-stamps-default,the tuxpaint corpus)
	$(call need,[ -d $(ICONS) ],oxygen-icon-theme,the icons corpus)
	$(call need,[ -d $(GCOMPRIS) ],gcompris-qt-data,the gcompris corpus)

# Headless Chromium for the search page's browser test (Playwright drives Debian's chromium; it never
# downloads a browser).
browser:
	$(call need,command -v chromium >/dev/null,chromium chromium-driver,the search page's browser test)

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

# The kill-and-resume test beside a busy loop on every core, RUNS times in a row (default 20), stopping at the first
# run whose losses drift (issue 83: about one run in 15 did, until MKL's vector math was settled first; docs/scale.md
# "Resumable")
stress: setup
	for i in $$(seq 1 $(or $(RUNS),20)); do echo "run $$i"; $(BIN)/python -m pytest tests/test_launch.py -k busy-loop || exit 1; done

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
