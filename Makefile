# Cocoon. `make demo` and `make test` are the whole set-up on a fresh
# Debian 12 machine; see README.md.

SHELL := /bin/bash
GO ?= go
PREFIX ?= /usr/local
SHARE_DIR ?= $(PREFIX)/share/cocoon
DOC_DIR ?= $(PREFIX)/share/doc/cocoon
GUEST_DIR ?= build/guest
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/cocoonrt/cocoon/runtime/version.Version=$(VERSION)
AGENT_LDFLAGS := -s -w -X github.com/cocoonrt/cocoon/guest/agent.Version=$(VERSION)
# Debian packages the build, the tests and the demo need (runc for the host
# side of the benchmarks and tests, crun for the agent tests on cgroup v2 hosts;
# criu for runc's checkpoints next to Cocoon's in the benchmarks, and because
# containerd's CRI refuses to checkpoint any container without a CRIU binary;
# the guest's crun is built static from Debian's source by guest/image/crun.sh,
# whose build runs python3). The scripts under guest/image install nothing:
# a package missing here fails the build with its name, and `make check-fresh`
# builds in a root that has only these.
DEB_PACKAGES := qemu-system-x86 qemu-utils runc crun containerd erofs-utils e2fsprogs cpio lz4 zstd \
	busybox-static iproute2 kmod util-linux procps psmisc git make gcc libc6-dev binutils bc flex bison \
	perl libelf-dev xz-utils linux-source-6.1 protobuf-compiler jq ca-certificates dpkg-dev pkg-config \
	python3 libseccomp-dev libcap-dev criu

.PHONY: all build guest install deploy-root deps demo test test-deps test-unit test-integration check-fresh bench critest proto clean FORCE

all: build

build: bin/cocoon bin/cocoon-agent bin/containerd-shim-cocoon-v2

# Every package's sources: Go's own caching makes rebuilding cheap, so
# binaries are rebuilt whenever anything under the tree changes, and when
# VERSION does (build/.version changes with it: a commit that touches no Go
# file still gives binaries of the new version). -buildvcs=false: the version
# is VERSION, so a binary does not depend on whether the tree it is built
# from is a git clone or an archive of one.
VERSION_STAMP := build/.version
GO_SOURCES := $(shell find . -name '*.go' -not -path './build/*' 2>/dev/null) go.mod go.sum $(VERSION_STAMP)

$(VERSION_STAMP): FORCE
	@mkdir -p $(@D); [ "$$(cat $@ 2>/dev/null)" = '$(VERSION)' ] || echo '$(VERSION)' > $@
FORCE:

bin/cocoon: $(GO_SOURCES)
	$(GO) build -trimpath -buildvcs=false -ldflags '$(LDFLAGS)' -o $@ ./cmd/cocoon

bin/containerd-shim-cocoon-v2: $(GO_SOURCES)
	$(GO) build -trimpath -buildvcs=false -ldflags '$(LDFLAGS)' -o $@ ./cmd/containerd-shim-cocoon-v2

# The agent is PID 1 in the guest: static, no cgo.
bin/cocoon-agent: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags '$(AGENT_LDFLAGS)' -o $@ ./cmd/cocoon-agent

guest: bin/cocoon-agent
	bash guest/image/build.sh bin/cocoon-agent $(GUEST_DIR)

# containerd's CRI configuration for the handler cocoon, for config
# versions 2 (containerd 1.6, 1.7) and 3 (2.x), as `cocoon
# containerd-config` prints it from the code `cocoon deploy install`
# edits containerd's configuration with (docs/containerd.md shows the
# same, which a test checks).
CRI_SNIPPETS := build/doc/containerd-cri-v2.toml build/doc/containerd-cri-v3.toml
build/doc/containerd-cri-v%.toml: bin/cocoon
	@mkdir -p $(@D)
	bin/cocoon containerd-config --version $* > $@.tmp && mv $@.tmp $@

# Then the template of the configured shape (docs/templates.md), so that the
# first sandbox starts from it instead of booting: `cocoon template create`
# boots a guest once and saves it (a few seconds under TCG), with the
# installed configuration, and only says that it exists when it does, so a
# second install boots nothing. A new guest image or QEMU is a new shape and
# gets its own; `cocoon gc` removes the old one. INSTALL_TEMPLATE= (empty)
# skips it, for an install that is not to run VMs.
INSTALL_TEMPLATE ?= yes

install: build guest $(CRI_SNIPPETS)
	install -D -m 0755 bin/cocoon $(PREFIX)/bin/cocoon
	install -D -m 0755 bin/containerd-shim-cocoon-v2 $(PREFIX)/bin/containerd-shim-cocoon-v2
	install -d -m 0755 $(SHARE_DIR)
	install -m 0644 $(GUEST_DIR)/vmlinux $(GUEST_DIR)/initrd.img $(GUEST_DIR)/manifest.json $(SHARE_DIR)/
	install -D -m 0644 -t $(DOC_DIR) $(CRI_SNIPPETS)
	$(if $(INSTALL_TEMPLATE),$(PREFIX)/bin/cocoon template create)

# What the cocoon-deploy image holds (deploy/Containerfile): make
# install's files under $(DEPLOY_ROOT)/usr/local, without a template (a
# node makes its own). Then, with a container builder:
#   docker build -f deploy/Containerfile -t ghcr.io/cocoonrt/cocoon-deploy:$(VERSION) $(DEPLOY_ROOT)
DEPLOY_ROOT ?= build/deploy-root
deploy-root:
	rm -rf $(DEPLOY_ROOT)
	$(MAKE) install PREFIX=$(CURDIR)/$(DEPLOY_ROOT)/usr/local INSTALL_TEMPLATE=

# $(call apt-install-missing,PACKAGES): a recipe that installs those of the
# Debian PACKAGES that are not installed, nothing else: safe to run again.
define apt-install-missing
@missing=""; for p in $(1); do \
	dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
done; \
if [ -n "$$missing" ]; then \
	echo "installing:$$missing"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
fi
endef

deps:
	$(call apt-install-missing,$(DEB_PACKAGES))

# Runs `uname -r` in a microVM through containerd: the host's containerd
# if one runs (namespace cocoon-demo, removed after), else a private
# containerd 1.6 stopped and removed after. The host is left as found.
demo: deps install
	$(GO) run ./integration/demo

# containerd versions the integration tests drive besides Debian's 1.6,
# the nerdctl they drive containers with, the crictl and critest they
# drive containerd's CRI with and the dockerd (moby v2) they run Docker
# with, built from the Go module proxy into $(TEST_TOOLS) (each kept until
# its version changes; dockerd with Debian's docker CLI beside it,
# integration/install-docker.sh), and a small Debian root with sudo for
# the exec-user tests (integration/debian-image.sh).
TEST_TOOLS ?= /opt/cocoon-test
CONTAINERD_17 ?= v1.7.30
CONTAINERD_24 ?= v2.4.2
NERDCTL ?= v1.7.7
CRI_TOOLS ?= v1.37.0
MOBY ?= v2.0.0-beta.24
# Debian packages the tests need and the product does not: the CNI plugins
# nerdctl and CRI run (into /usr/lib/cni), the iptables their bridge,
# portmap and firewall plugins call (Debian 12's default iptables-nft: the
# kernel has nf_tables and the xt matches they use), iperf3 for the network
# benchmark, tini for docker run --init (its static build, the daemon's
# init-path).
TEST_DEB_PACKAGES := containernetworking-plugins iptables iperf3 tini

test: deps test-deps build guest test-unit test-integration

test-deps:
	$(call apt-install-missing,$(TEST_DEB_PACKAGES))
	bash integration/install-containerd.sh $(CONTAINERD_17) $(TEST_TOOLS)/containerd-1.7
	bash integration/install-containerd.sh $(CONTAINERD_24) $(TEST_TOOLS)/containerd-2.4
	bash integration/install-nerdctl.sh $(NERDCTL) $(TEST_TOOLS)/nerdctl-1.7
	bash integration/install-cri-tools.sh $(CRI_TOOLS) $(TEST_TOOLS)/cri-tools-1.37
	bash integration/install-docker.sh $(MOBY) $(TEST_TOOLS)/docker
	bash integration/debian-image.sh $(TEST_TOOLS)/images

# The fuzz targets over what the guest sends, each run by test-unit for a
# number of inputs (go test -fuzz takes one package and one target at a
# time): <package>:<target>:<inputs>, one a line, the inputs about five
# seconds' worth on a 2-core host. A count and not a duration: a duration's
# deadline races the fuzzing workers' shutdown in Go 1.26 and fails a run
# with a bare "context deadline exceeded" (go.dev/issue/75804). Their seed
# corpora are in the packages' testdata/fuzz, and plain `go test` runs those.
FUZZ_TARGETS := \
	./guest/api:FuzzReadStreamHeader:40000 \
	./guest/api:FuzzGuestHandshake:40000 \
	./runtime/agent:FuzzGuestReply:15000 \
	./runtime/agent:FuzzGuestSession:2000 \
	./runtime/rootfs:FuzzCopyBackDiff:1500 \
	./runtime/checkpoint:FuzzReadSparse:30000 \
	./runtime/checkpoint:FuzzDecodeManifest:40000

test-unit:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
		if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /integration)
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; n=$${rest#*:}; \
		echo "fuzz $$name in $$pkg for $$n inputs"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $${n}x -fuzzminimizetime 0 "$$pkg" || exit 1; \
	done

# Real VMs, real QEMU: needs root. Uses the freshly built binaries and
# guest image, not whatever is installed.
test-integration:
	COCOON_IMAGE_DIR=$(CURDIR)/$(GUEST_DIR) COCOON_BIN=$(CURDIR)/bin \
		$(GO) test -count=1 -timeout 40m -v ./integration/...

# Builds the binaries and the guest image in a fresh, minimal Debian 12 root
# (mmdebstrap --variant=apt, cached) from what `make deps` installs and
# nothing else, and compares the image with this tree's (which it builds
# first): .ci/fresh-root.sh.
check-fresh:
	bash .ci/fresh-root.sh

# Boot and memory through the runtime API, then start, exec, stdout and
# memory through a private containerd 1.6 (io.containerd.cocoon.v2 with
# this tree's shim, next to io.containerd.runc.v2), then TCP throughput
# (iperf3, in a small Debian root made here and cached by key) and HTTP
# latency through nerdctl's bridge networking on a private containerd 1.6,
# then pods through crictl and the CRI of a private containerd 2.4 and 1.6
# (handlers cocoon and runc, a CNI bridge): pod start, one at a time and
# 10 at once, and the memory of each of 10 running pods (test-deps
# installs nerdctl, crictl, the CNI plugins, iperf3 and containerd 2.4).
# Leaves nothing running.
bench: build guest test-deps
	bash integration/debian-image.sh $(TEST_TOOLS)/images iperf3 iperf3
	COCOON_IMAGE_DIR=$(CURDIR)/$(GUEST_DIR) COCOON_BIN=$(CURDIR)/bin $(GO) run -ldflags '$(LDFLAGS)' ./bench -out bench/results/latest.json

# critest, cri-tools' CRI validation suite, offline (docs/conformance.md):
# stand-ins of the images it pulls (integration/critest/images.go, made of
# Debian's busybox, which fetch-busybox.sh downloads, and a static Go
# program) on a registry on 127.0.0.1 that the CRI containerd mirrors
# registry.k8s.io, k8s.gcr.io and gcr.io to; per containerd version of
# CRITEST_CONTAINERD a fresh containerd for each handler of
# CRITEST_HANDLERS (the cocoon run holding /tmp/cocoon-vm-tests.lock), the
# counts, and the specs that pass with runc and fail with cocoon. Fails if
# a spec of integration/critest/baseline-<version>.txt does not pass with
# cocoon; CRITEST_UPDATE=1 rewrites the baselines from the run instead.
# CRITEST_FLAGS goes to the runner (-focus REGEXP, -skip REGEXP). Reports
# and logs in build/critest. Leaves nothing running.
CRITEST_CONTAINERD ?= 2.4,1.6
CRITEST_HANDLERS ?= runc,cocoon
CRITEST_FLAGS ?=
CRITEST_BUSYBOX ?= $(TEST_TOOLS)/busybox

critest: build guest test-deps
	bash integration/critest/fetch-busybox.sh $(CRITEST_BUSYBOX)
	cd integration/critest && $(GO) vet ./... && \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(CURDIR)/build/critest/standin ./standin && \
		$(GO) build -o $(CURDIR)/build/critest/runner .
	COCOON_IMAGE_DIR=$(CURDIR)/$(GUEST_DIR) COCOON_BIN=$(CURDIR)/bin build/critest/runner \
		-containerd $(CRITEST_CONTAINERD) -handlers $(CRITEST_HANDLERS) \
		-critest $(TEST_TOOLS)/cri-tools-1.37/bin/critest -busybox $(CRITEST_BUSYBOX)/bin/busybox \
		-standin build/critest/standin -out build/critest -baseline-dir integration/critest \
		$(if $(CRITEST_UPDATE),-update-baseline,-check) $(CRITEST_FLAGS)

proto:
	cd guest/api && $(GO) generate ./...

clean:
	rm -rf bin build
