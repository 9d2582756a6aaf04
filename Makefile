# Installs rlaunch as a site administrator expects: the two binaries side by side (rlaunch
# finds rlaunch-proxy next to itself), the manual page and the shell completions, all three
# written from rlaunch's own option table (rlaunch-docs), so that they cannot drift from it.
#
#   make install PREFIX=/opt/rlaunch      # also DESTDIR=... for packaging
#   make install-mpi-links PREFIX=...     # mpiexec and mpirun as links to rlaunch
#   make uninstall PREFIX=...

PREFIX ?= /usr/local
DESTDIR ?=
CARGO ?= cargo
# cargo's profile: release (the default), or dev for a quick install of a debug build.
PROFILE ?= release
OUT = $(if $(filter dev,$(PROFILE)),debug,$(PROFILE))
BINDIR = $(DESTDIR)$(PREFIX)/bin
MANDIR = $(DESTDIR)$(PREFIX)/share/man/man1
BASHDIR = $(DESTDIR)$(PREFIX)/share/bash-completion/completions
ZSHDIR = $(DESTDIR)$(PREFIX)/share/zsh/site-functions
FISHDIR = $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
# Where cargo puts the binaries: target/<host triple>/<profile> (.cargo/config.toml); give
# BUILT=DIR to install binaries built already, without running cargo.
BUILT ?= $(shell $(CARGO) build --profile $(PROFILE) -p rlaunch -p rlaunch-proxy -q >&2 && \
	dirname "$$(ls -t target/*/$(OUT)/rlaunch | head -n 1)")

.PHONY: all install install-mpi-links uninstall

all:
	$(CARGO) build --profile $(PROFILE) -p rlaunch -p rlaunch-proxy

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
