# One image per Warden binary, FROM scratch: no base image can be pulled, so
# nothing is compiled here. `make images` builds the static binaries into
# bin/ first (CGO_ENABLED=0) and then runs, for each of them,
#   docker build --build-arg BINARY=<name> -t warden/<name>:dev .
# where <name> is scheduler, supervisor, agent, warden or nats-server.
#
# The image holds only the binary (/app) and configs/ (/etc/warden): no
# shell, no CA certificates, no user database. Processes run as the user
# docker-compose.yml chooses.
FROM scratch
ARG BINARY=scheduler
LABEL org.opencontainers.image.title="warden-${BINARY}" \
      org.opencontainers.image.source="https://github.com/wardenhq/warden"
COPY bin/${BINARY} /app
COPY configs/ /etc/warden/
ENTRYPOINT ["/app"]
