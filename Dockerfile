# One image per Warden binary, FROM scratch: no base image can be pulled, so
# nothing is compiled here. `make images` builds the static binaries into
# bin/ first (CGO_ENABLED=0) and then runs, for each of them,
#   docker build --build-arg BINARY=<name> -t warden/<name>:dev .
# where <name> is scheduler, supervisor, agent, warden or nats-server.
#
# The image holds only the binary (/app), configs/ (/etc/warden) and an
# empty /data owned by the runtime user (nats-server's JetStream store; a
# named volume mounted there inherits the ownership). No shell, no CA
# certificates, no user database. Everything runs as uid/gid 65532, never
# root; credentials are mounted read-only at run time (docker-compose.yml).
FROM scratch
ARG BINARY=scheduler
LABEL org.opencontainers.image.title="warden-${BINARY}" \
      org.opencontainers.image.source="https://github.com/wardenhq/warden"
COPY --chown=65532:65532 bin/.empty/ /data/
COPY --chown=0:0 bin/${BINARY} /app
COPY --chown=0:0 configs/ /etc/warden/
USER 65532:65532
ENTRYPOINT ["/app"]
