# `make` is the README's first command: what the build needs besides Rust, installed where it
# can be (tools/build-deps.sh: a C compiler, OpenPMIx's development files), then the quick
# build of rlaunch, rlaunch-proxy and the hello example (cargo's release profile).
#
# `make install` installs rlaunch as a site administrator expects, from the packaging build
# (the dist profile: whole-program optimisation, docs/measurements.md "Build profiles"): the
# two binaries side by side (rlaunch finds rlaunch-proxy next to itself), the manual page and
# the shell completions, all three written from rlaunch's own option table (rlaunch-docs), so
# that they cannot drift from it.
#
#   make install PREFIX=/opt/rlaunch      # also DESTDIR=... for packaging
#   make install-mpi-links PREFIX=...     # mpiexec and mpirun as links to rlaunch
#   make uninstall PREFIX=...

PREFIX ?= /usr/local
DESTDIR ?=
CARGO ?= cargo
# cargo's profile of what `make install` installs: dist (the default), release for the quick
# build, or dev for a debug build.
PROFILE ?= dist
OUT = $(if $(filter dev,$(PROFILE)),debug,$(PROFILE))
BINDIR = $(DESTDIR)$(PREFIX)/bin
MANDIR = $(DESTDIR)$(PREFIX)/share/man/man1
BASHDIR = $(DESTDIR)$(PREFIX)/share/bash-completion/completions
ZSHDIR = $(DESTDIR)$(PREFIX)/share/zsh/site-functions
FISHDIR = $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
# Where cargo puts the binaries: target/<host triple>/<profile> (.cargo/config.toml); give
# BUILT=DIR to install binaries built already, without running cargo.
BUILT ?= $(shell tools/build-deps.sh && \
	$(CARGO) build --profile $(PROFILE) -p rlaunch -p rlaunch-proxy -q >&2 && \
	dirname "$$(ls -t target/*/$(OUT)/rlaunch | head -n 1)")

.PHONY: all install install-mpi-links uninstall

all:
	@tools/build-deps.sh
	$(CARGO) build --release -p rlaunch -p rlaunch-proxy -p rlaunch-examples

install:
	@set -e; bin="$(BUILT)"; \
	install -d "$(BINDIR)" "$(MANDIR)" "$(BASHDIR)" "$(ZSHDIR)" "$(FISHDIR)"; \
	install -m 0755 "$$bin/rlaunch" "$$bin/rlaunch-proxy" "$(BINDIR)/"; \
	"$$bin/rlaunch-docs" man > "$(MANDIR)/rlaunch.1"; \
	"$$bin/rlaunch-docs" completions bash > "$(BASHDIR)/rlaunch"; \
	for name in mpiexec mpirun; do ln -sf rlaunch "$(BASHDIR)/$$name"; done; \
	"$$bin/rlaunch-docs" completions zsh > "$(ZSHDIR)/_rlaunch"; \
	"$$bin/rlaunch-docs" completions fish > "$(FISHDIR)/rlaunch.fish"; \
	echo "installed rlaunch $$("$(BINDIR)/rlaunch" --version | cut -d' ' -f2-) in $(DESTDIR)$(PREFIX)"

install-mpi-links: install
	ln -sf rlaunch "$(BINDIR)/mpiexec"
	ln -sf rlaunch "$(BINDIR)/mpirun"
	ln -sf rlaunch.1 "$(MANDIR)/mpiexec.1"
	ln -sf rlaunch.1 "$(MANDIR)/mpirun.1"

uninstall:
	rm -f "$(BINDIR)/rlaunch" "$(BINDIR)/rlaunch-proxy" "$(MANDIR)/rlaunch.1" \
	      "$(BASHDIR)/rlaunch" "$(BASHDIR)/mpiexec" "$(BASHDIR)/mpirun" "$(ZSHDIR)/_rlaunch" \
	      "$(FISHDIR)/rlaunch.fish"
	for name in mpiexec mpirun; do \
	    [ "$$(readlink "$(BINDIR)/$$name")" = rlaunch ] && rm -f "$(BINDIR)/$$name" "$(MANDIR)/$$name.1"; \
	done; true
