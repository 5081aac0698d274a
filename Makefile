# cdcrelay: make demo | make test | make test-unit | make lint | make build
# make test-unit: the service-free layer (no PostgreSQL, no RabbitMQ, no built
# binaries), under a minute once the build cache is warm (the first run
# compiles everything with -race: about 6.5 min on a cold 2-core machine);
# make test: all but the slow suites .ci/run adds (test-faults,
# test-pg-matrix, fuzz, test-k8s). docs/testing.md.
# make test-pg-matrix: the replication tests against PostgreSQL 13, 14, 16, 17
# and 18 (make test uses Debian's 15).
GO        ?= go
GOLANGCI  ?= $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
# FUZZTIME empty: each fuzz target runs a fixed number of executions (about
# 10 s each on 2 cores). A count, unlike a duration, sidesteps a race in Go
# 1.26's fuzz coordinator (golang/go#75804, fixed in 1.27) that fails a clean
# run with "context deadline exceeded" at the deadline. FUZZTIME=5m (or
# 1000000x) runs every target longer.
FUZZTIME  ?=
fuzzfor    = $(if $(FUZZTIME),$(FUZZTIME),$(1))
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION  ?= $(shell git rev-parse HEAD 2>/dev/null)
# Image time stamps (reproducible builds): the last commit's time.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
# IMAGEFLAGS=-arch=arm64 builds for another architecture.
IMAGEFLAGS ?=

.PHONY: build image demo demo-inbox tour-db test test-unit test-go test-faults test-pg-matrix test-rabbitmq4 test-rabbitmq4-relay test-rabbitmq4-relay-faults test-rabbitmq4-kit test-rabbitmq4-faults test-alerts fuzz chart-test test-k8s bench bench-retention lint clean

build:
	$(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o bin/cdcrelay ./cmd/cdcrelay

# The container image as an OCI image archive, bin/cdcrelay-image.tar, built with
# the Go toolchain alone (no container daemon, no base image): the static relay,
# the host's CA bundle, user 65532. Push it with skopeo, or load it with docker or
# podman: deploy/helm/README.md, "The image". The Dockerfile builds the same image
# where a daemon and the base images are at hand.
image:
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(GO) run ./tools/image -version $(VERSION) -revision "$(REVISION)" -o bin/cdcrelay-image.tar $(IMAGEFLAGS)

# Starts a throwaway PostgreSQL, runs the relay against it and the local
# RabbitMQ, inserts sample events and shows them arriving with their latency.
# The first build compiles every dependency (about 3.5 min on a cold 2-core
# machine, silently), so the target says so first. go run -trimpath shares
# the build's cache entries; without -trimpath it would compile them again.
FIRST_BUILD_NOTE = the first build takes a few minutes on a cold machine, later ones seconds

demo:
	@echo "make demo: building bin/cdcrelay and the demo ($(FIRST_BUILD_NOTE))..."
	@$(MAKE) --no-print-directory build
	$(GO) run -trimpath ./cmd/cdcrelay-demo -relay bin/cdcrelay

# The consumer's half (docs/consumers.md): the relay feeds a consumer built on
# package inbox, which is killed once mid-stream after an effect and before its
# ack; prints effects applied = events committed and the duplicates absorbed,
# and fails if they differ.
demo-inbox:
	@echo "make demo-inbox: building bin/cdcrelay and the demo ($(FIRST_BUILD_NOTE))..."
	@$(MAKE) --no-print-directory build
	$(GO) run -trimpath ./cmd/cdcrelay-inbox-demo -relay bin/cdcrelay

# The README's tour needs a PostgreSQL with wal_level=logical: the demo's
# throwaway cluster (cmd/cdcrelay-demo -serve) with a database app, kept
# until Ctrl-C, which stops and removes it. It prints the
# CDCRELAY_DATABASE_URL to export.
tour-db:
	@echo "make tour-db: building the demo program ($(FIRST_BUILD_NOTE))..."
	$(GO) run -trimpath ./cmd/cdcrelay-demo -serve

# The whole suite but the slow ones (fault matrix, version matrix, fuzzing,
# the API server; .ci/run runs those too): formatting, vet, unit and
# integration tests (real PostgreSQL and RabbitMQ) with the race detector and
# the fuzz targets' seed corpora, and the Helm chart tests, then the live
# alert test (which needs the helm binary the chart tests build).
test: test-go chart-test test-alerts

# Every test not named TestIntegration*: pure logic, fakes and fuzz seeds,
# with the race detector, shuffled, goroutine leaks checked in the pure
# packages. Needs no service; testenv fails a test that starts one without
# the TestIntegration prefix (docs/testing.md, "The TestIntegration rule").
test-unit:
	$(GO) test -race -count=1 -shuffle=on -skip '^TestIntegration' ./...

# -parallel 4: the parallel tests (internal/relay/main_test.go) mostly wait,
# so four at a time on two cores overlap their waits. internal/relay comes
# first: go test starts packages in the order given, two at a time on two
# cores, and the longest (internal/relay, 6-7 min) used to start 3 min in
# and run alone at the end.
test-go:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt: not formatted:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m -parallel 4 ./internal/relay/ ./...

# The slow part of the fault matrix (docs/reliability.md): real broker
# outages on a private RabbitMQ node, partitions, crashes, SIGKILL at exact
# boundaries (failpoints), a 200,000-event backlog, and the tests of
# internal/relay's files tagged faults, RELAY_FAULT_TESTS: the review's
# bounded queue set-ups, a private node's max_message_size and the long
# waiting tests make test leaves out, such as a 60 s idle window
# (internal/relay/main_test.go). A repocheck test holds every test of those
# files to that list. .ci/run runs it too.
RELAY_FAULT_TESTS = ^TestIntegration(BoundedQueueReview[A-Za-z]*|BrokerSizeLimit(Parked|Raised)|StandbyZeroPolling|StopWhileBrokerBlocksAFullSocket|LockLostDuringDrain|MarksFailingDegraded)$$

test-faults:
	$(GO) test -race -tags 'faults failpoints' -count=1 -timeout 30m ./internal/faults/ ./internal/failpoint/
	$(GO) test -race -tags faults -count=1 -timeout 10m -parallel 4 -run '$(RELAY_FAULT_TESTS)' ./internal/relay/

# The PostgreSQL version matrix (docs/testing.md): the tests of replication,
# slots, the outbox and the testenv standby against each major in
# .ci/postgres-versions, whose server binaries .ci/install-postgres caches in
# /var/cache/cdcrelay/postgres (it needs node and npm the first time);
# PGMATRIX_TESTS_16 runs too against 16 and later, PGMATRIX_TESTS_17 against
# 17 and later, all with the build tag pgmatrix. Every version runs, then the
# target fails if one did. PGMATRIX_VERSIONS="13 17" picks versions ("15" is
# Debian's). .ci/run runs it after make test.
PGMATRIX_VERSIONS ?= $(shell awk '$$1 ~ /^[0-9]+$$/ {print $$1}' .ci/postgres-versions)
PGMATRIX_TESTS    = ^TestIntegration(ExactlyOnceInCommitOrder|SIGKILLMidStream|InsertedWhileDown|AdoptionWithoutGap|AdoptionInterrupted|PoisonParked|PoisonInBacklog|MarksSurviveSIGKILL|MarksDurableUnderAsyncCommit|JanitorNeverMarksUnacked|PartitionedOutbox|QuotedOutbox|OutboxRenamedOrMovedMidStream|MarksAfterIDTypeChange|HeaderValuesExact|SlotLostRecreated|Retention|Standby(Replays|Promote|KilledPrimary|KillStandby)|Probe)$$
PGMATRIX_TESTS_16 = ^TestIntegration(StandbySlot[A-Za-z]*|StandbyCheck|MarkOrigin[A-Za-z]*|MonitorSlotOnStandby|MonitorOtherRelayOnStandby|SecondRelayOnStandby)$$
PGMATRIX_TESTS_17 = ^TestIntegrationFailover[A-Za-z]*$$

test-pg-matrix:
	GO='$(GO)' PGMATRIX_VERSIONS='$(PGMATRIX_VERSIONS)' PGMATRIX_TESTS='$(PGMATRIX_TESTS)' \
		PGMATRIX_TESTS_16='$(PGMATRIX_TESTS_16)' PGMATRIX_TESTS_17='$(PGMATRIX_TESTS_17)' .ci/pg-matrix

# RabbitMQ 4.x (docs/testing.md, "RabbitMQ 4.x"): .ci/with-rabbitmq4 starts
# a throwaway 4.3 node from the chroot .ci/install-rabbitmq builds once per
# machine in /var/cache/cdcrelay/rabbitmq4 (needs root), with upstream's
# deprecation defaults, and points the shared-broker tests and the private
# nodes (refusals, max_message_size, alarms, node loss, a 3-node cluster)
# at 4.3. The relay's tests that talk to the broker (RABBITMQ4_RELAY_TESTS:
# publishing, confirms, refusals, returns, parking, lanes, adoption, TLS,
# the stream and quorum targets; those that exercise only PostgreSQL run
# against 3.10 alone), the fault matrix's broker cases, tail, check, inbox
# and the kit. Without -race: the race detector is about the relay's code,
# which make test and make test-faults run with it; this target is about
# the broker. .ci/run runs it.
RABBITMQ4_RELAY_TESTS = ^TestIntegration(Adoption[A-Za-z]*|HeaderValuesExact|LanesStallNoRepublish|ModelReturnOnIdleOutboxRetriesWithChannels|MonitorDuringBrokerOutage|NeedsOperatorBrokerPassword|PartitionedPublishing|OversizeShortStringsParked|Poison[A-Za-z]*|Unroutable[A-Za-z]*|StatusSaysWhyItRetries|AckedBeforeRefusalNotRepublished|BoundedQueueMakesProgress|BrokerRefusedHeaderParked|DeadLetterCopyNeverStalls|ExactlyOnceInCommitOrder|SIGKILLMidStream|InsertedWhileDown|IdleSlotAdvances|WatermarkWaitsForConfirms|ReturnedMessageBlocksTheSlot|MessageShape|AMQPTLS|NoSecretInOutput|StreamTarget|QuorumLengthLimitOvershoot|MetricsUnderLoad|JanitorNeverMarksUnacked)$$
RABBITMQ4_FAULT_TESTS = ^TestIntegration(BoundedQueueReview[A-Za-z]*|BrokerSizeLimit(Parked|Raised)|StopWhileBrokerBlocksAFullSocket)$$

# The groups below run inside .ci/with-rabbitmq4 only: anywhere else they
# would test the machine's 3.10 and say 4.x passed.
RABBITMQ4_ONLY = case "$$CDCRELAY_TEST_AMQP_URL" in *:$${RABBITMQ4_PORT:-5870}/*) ;; \
	*) echo "$@ runs inside .ci/with-rabbitmq4: use make test-rabbitmq4" >&2; exit 1 ;; esac

# One 4.3 node for the four groups, run side by side (-j 4; they mostly
# wait on the broker and the clock), each group's output kept together (-O).
test-rabbitmq4:
	.ci/with-rabbitmq4 $(MAKE) --no-print-directory -j 4 -O test-rabbitmq4-relay test-rabbitmq4-relay-faults test-rabbitmq4-kit test-rabbitmq4-faults

test-rabbitmq4-relay:
	@$(RABBITMQ4_ONLY)
	$(GO) test -count=1 -timeout 15m -parallel 4 -run '$(RABBITMQ4_RELAY_TESTS)' ./internal/relay/

test-rabbitmq4-relay-faults:
	@$(RABBITMQ4_ONLY)
	$(GO) test -tags faults -count=1 -timeout 10m -parallel 4 -run '$(RABBITMQ4_FAULT_TESTS)' ./internal/relay/

test-rabbitmq4-kit:
	@$(RABBITMQ4_ONLY)
	$(GO) test -count=1 -timeout 15m -parallel 4 -run '^TestIntegration' \
		./cmd/cdcrelay/ ./inbox/ ./internal/preflight/ ./internal/publish/ ./internal/brokerapi/ ./internal/testenv/

test-rabbitmq4-faults:
	@$(RABBITMQ4_ONLY)
	$(GO) test -tags faults -count=1 -timeout 20m -run '^TestIntegrationBroker' ./internal/faults/

# Each fuzz target for a fixed count (about 2 min in all, with the fuzzing
# builds); their seed corpora run in every go test. .ci/run runs it.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(call fuzzfor,150000x) ./internal/wal/
	$(GO) test -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(call fuzzfor,4000x) ./internal/config/
	$(GO) test -run '^$$' -fuzz '^FuzzIdent$$' -fuzztime $(call fuzzfor,100000x) ./internal/config/
	$(GO) test -run '^$$' -fuzz '^FuzzRedact$$' -fuzztime $(call fuzzfor,120000x) ./internal/config/
	$(GO) test -run '^$$' -fuzz '^FuzzEnvelope$$' -fuzztime $(call fuzzfor,100000x) ./internal/publish/
	$(GO) test -run '^$$' -fuzz '^FuzzHeaderValues$$' -fuzztime $(call fuzzfor,100000x) ./internal/publish/
	$(GO) test -run '^$$' -fuzz '^FuzzPipeline$$' -fuzztime $(call fuzzfor,400x) ./internal/publish/
	$(GO) test -run '^$$' -fuzz '^FuzzClaim$$' -fuzztime $(call fuzzfor,15000x) ./inbox/
	$(GO) test -run '^$$' -fuzz '^FuzzParseLSN$$' -fuzztime $(call fuzzfor,100000x) ./inbox/
	$(GO) test -run '^$$' -fuzz '^FuzzTopicMatch$$' -fuzztime $(call fuzzfor,200000x) ./internal/brokerapi/

chart-test:
	$(MAKE) -C deploy/helm test

# The chart on a real kube-apiserver (deploy/helm/k8stest; docs/testing.md,
# "The chart on a real API server"): .ci/install-kube builds kube-apiserver
# and fetches etcd and the prometheus-operator CRDs into
# /var/cache/cdcrelay/kube the first time (about 10 min on 2 cores), then the
# test installs, upgrades and uninstalls the chart in a namespace enforcing
# PodSecurity's restricted profile. .ci/run runs it.
test-k8s:
	.ci/install-kube
	$(MAKE) -C deploy/helm helm
	helm=$$($(MAKE) -s --no-print-directory -C deploy/helm helm-path) && \
		cd deploy/helm/k8stest && $(GO) vet ./... && HELM=$$helm $(GO) test -count=1 -timeout 10m -v ./...

# One live test (internal/alertlive): a real Prometheus (Debian's prometheus
# package) scrapes the relay and evaluates the chart's rendered alert rules
# through a broker outage. Needs the helm binary chart-test builds into
# the user's cache folder; the test fails, naming the fix, when it is missing.
test-alerts:
	HELM=$$($(MAKE) -s --no-print-directory -C deploy/helm helm-path) $(GO) test -race -tags alerts -count=1 ./internal/alertlive/

# Measures the relay against the broker's own ceiling in one run (4-5 min):
# drain, latency, PostgreSQL load and memory; see docs/performance.md.
# BENCHFLAGS=-quick for a one-minute smoke run. The broker is the local one
# (127.0.0.1:5672) unless BENCH_AMQP_URL in the environment names another,
# e.g. BENCH_AMQP_URL=amqp://guest:guest@127.0.0.1:5870/ make bench; the
# report's first line names the broker's product and version.
bench: build
	$(GO) run ./tools/bench -relay bin/cdcrelay $(BENCHFLAGS)

# Retention over 1,000,000 expired rows (1-2 min): buffers per batch, the
# timed run and marking latency meanwhile; see docs/performance.md.
bench-retention:
	$(GO) test -tags retentionbench -run TestIntegrationRetentionMillion -v -count=1 -timeout 60m ./internal/retention/

# deadcode (make lint) follows every build tag, so that code used only by
# the fault suites, the version matrix or a bench counts as reachable. Only
# its standard output lists dead code: go run's download notes and any
# failure go to standard error, and a failure fails the target by its exit.
DEADCODE_TAGS = faults failpoints pgmatrix alerts retentionbench

lint:
	$(GOLANGCI) run ./...
	$(GOLANGCI) run --build-tags 'faults failpoints' ./internal/faults/... ./internal/failpoint/... ./internal/relay/...
	$(GOLANGCI) run --build-tags alerts ./internal/alertlive/...
	$(GOLANGCI) run --build-tags pgmatrix ./internal/relay/... ./internal/monitor/... ./internal/testenv/...
	cd deploy/helm/charttest && $(GOLANGCI) run ./...
	cd deploy/helm/k8stest && $(GOLANGCI) run ./...
	@out=$$($(GO) run golang.org/x/tools/cmd/deadcode@v0.52.0 -test -tags '$(DEADCODE_TAGS)' ./...) || exit 1; \
		if [ -n "$$out" ]; then echo "deadcode: unreachable functions:"; echo "$$out"; exit 1; fi

clean:
	rm -rf bin
