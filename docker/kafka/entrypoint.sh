#!/bin/sh
# spark-eos/kafka entrypoint: the embedded Apache Kafka's broker as PID 1 (so `docker kill` is a
# real crash of the broker JVM): a single KRaft node (broker + controller, node 1) on 127.0.0.1,
# for the host network. The jars, server.properties and JVM flags under /opt/eos-kafka were
# rendered by connectors/services/apache_kafka.py when the image was built.
#
#   KAFKA_PORT (9092)             the PLAINTEXT listener, advertised as 127.0.0.1:$KAFKA_PORT
#   KAFKA_CONTROLLER_PORT (9093)  the KRaft controller listener on 127.0.0.1
#   KAFKA_CLUSTER_ID              the cluster id formatted on first start (default: a random one)
#
# The data volume /var/lib/eos-kafka holds server.properties (written at every start) and the log
# segments in data/; the storage is formatted on first start only, so a restarted container
# (after `docker kill` or `docker stop`) serves what it had written.
set -eu
home=/opt/eos-kafka
volume=/var/lib/eos-kafka
port=${KAFKA_PORT:-9092}
controller=${KAFKA_CONTROLLER_PORT:-9093}

fail() { echo "eos-kafka: $*" >&2; exit 64; }
for pair in "KAFKA_PORT=$port" "KAFKA_CONTROLLER_PORT=$controller"; do
    value=${pair#*=}
    case $value in '' | *[!0-9]*) fail "$pair is not a TCP port (1-65535)" ;; esac
    [ "${#value}" -le 5 ] && [ "$value" -ge 1 ] && [ "$value" -le 65535 ] || fail "$pair is not a TCP port (1-65535)"
done
[ "$port" != "$controller" ] || fail "KAFKA_PORT and KAFKA_CONTROLLER_PORT are both $port; the broker needs two ports"

mkdir -p "$volume"
sed -e "s/@KAFKA_PORT@/$port/g" -e "s/@KAFKA_CONTROLLER_PORT@/$controller/g" \
    "$home/config/server.properties.in" > "$volume/server.properties"
java="$JAVA_HOME/bin/java"
if [ ! -f "$volume/data/meta.properties" ]; then
    id=${KAFKA_CLUSTER_ID:-}
    while [ -z "$id" ]; do  # Kafka's Uuid: 16 random bytes, URL-safe base64, no padding, no leading '-'
        id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
        case $id in -*) id= ;; esac
    done
    "$java" "@$home/config/jvm.args" kafka.tools.StorageTool format -t "$id" -c "$volume/server.properties"
fi
exec "$java" "@$home/config/jvm.args" kafka.Kafka "$volume/server.properties"
