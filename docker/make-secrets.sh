#!/bin/sh
# Makes what docker/compose.yml mounts from docker/secrets/ (or DIR): a CA, etcd's
# server certificate (etcd1..3, also their peer certificate), client certificates for
# the canal-ha nodes, the Spark job and etcd's root, random passwords, the REST token,
# and the Canal TCP user's password with its hash (canal_passwd). Run once before
# `docker compose -f docker/compose.yml up`:
#
#   sh docker/make-secrets.sh            # writes docker/secrets/
#
# The directory is private (0700); the files in it are readable (0644) because the
# containers run as other users (canal-ha: uid 10001) and see only the files mounted
# into them. Existing files are kept (run it again after deleting one to renew it).
# docker/secrets/ is not part of the repository (.gitignore) nor of the image.
set -eu

DIR=${1:-$(dirname "$0")/secrets}
DAYS=${DAYS:-825}
mkdir -p "$DIR"
chmod 700 "$DIR"
cd "$DIR"
umask 022

password() {  # password FILE: 32 random hex digits, no newline
    [ -s "$1" ] || openssl rand -hex 16 | tr -d '\n' > "$1"
}

ca() {
    [ -s ca.crt ] || openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
        -nodes -keyout ca.key -out ca.crt -days "$DAYS" -subj "/CN=canal-ha compose CA" 2>/dev/null
}

cert() {  # cert NAME CN SUBJECT_ALT_NAMES
    [ -s "$1.crt" ] && return 0
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
        -out "$1.crt" -days "$DAYS" -extfile "$1.ext" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}

ca
cert etcd-server etcd "DNS:etcd1,DNS:etcd2,DNS:etcd3,DNS:localhost,IP:127.0.0.1"
cert canal-node canal-node "DNS:canal-node"
cert spark spark "DNS:spark"
cert etcd-root root "DNS:root"
password etcd_root_password
password etcd_canal_password
password etcd_spark_password
password mariadb_root_password
password canal_db_password
password grafana_admin_password
password repl_password
password rest_token
password canal_password  # the Canal TCP user's (canal.user = "canal")
# canal.passwd: hex SHA1(SHA1(password)), as Canal keeps it
[ -s canal_passwd ] || printf %s "$(cat canal_password)" | openssl dgst -sha1 -binary \
    | openssl dgst -sha1 -hex | sed 's/.*= //' | tr -d '\n' > canal_passwd
chmod 644 ./*
chmod 600 ca.key  # signs certificates: no container needs it
echo "secrets in $(pwd)"
