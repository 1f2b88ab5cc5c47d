"""What secures the embedded Apache Kafka (``security="sasl_ssl"``): its certificate and super users
(``Secured``), and the principals of the apps, each holding exactly the ACLs it was granted (``Principal``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eos_core.privileges import KafkaAcl

__all__ = ["ADMIN", "MECHANISM", "SECURITY", "Principal", "Secured", "binding"]

SECURITY = ("sasl_ssl", "plaintext")
"""``sasl_ssl``: a SASL_SSL listener (SCRAM-SHA-512 over TLS, a certificate of a CA made at start) and ACLs
enforced (StandardAuthorizer, no ACL means no access); ``plaintext``: no authentication, no ACLs."""
MECHANISM = "SCRAM-SHA-512"
ADMIN = "admin"  # the super user the services set up and check with; apps get principals of their own


class Secured:
    """What a SASL_SSL broker is made of: its certificate (issued by a CA of its own, in ``directory``), the
    passwords of its super users (``admin``, for setting up and checking; ``broker``, itself on its
    listener; ``controller``, on its controller listener) and the client settings that log in with them."""

    def __init__(self, directory: Path) -> None:
        import secrets

        from connectors.services.tls import CertificateAuthority

        self.dir = directory
        self.ca = CertificateAuthority(directory / "ca")
        self.cert = self.ca.issue(directory / "tls")
        self.passwords = {name: secrets.token_urlsafe(18) for name in (ADMIN, "broker", "controller")}

    @staticmethod
    def jaas(module: str, **fields: str) -> str:
        """A JAAS line (``module`` ``ScramLoginModule`` or ``PlainLoginModule``) with ``fields`` quoted."""
        quoted = " ".join(f'{k}="{v}"' for k, v in fields.items())
        return f"org.apache.kafka.common.security.{module} required {quoted};"

    def properties(self) -> dict[str, str]:
        controller = self.passwords["controller"]
        return {
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": self.jaas(
                "scram.ScramLoginModule", username="broker", password=self.passwords["broker"]
            ),
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": self.jaas(
                "plain.PlainLoginModule", username="controller", password=controller, user_controller=controller
            ),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.cert.chain),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.cert.ca),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": "User:admin;User:broker;User:controller",
        }

    def scram_arguments(self) -> list[str]:
        """StorageTool's arguments that put the SCRAM credentials of ``admin`` and ``broker`` in the metadata."""
        return [
            a
            for name in (ADMIN, "broker")
            for a in ("--add-scram", f"{MECHANISM}=[name={name},password={self.passwords[name]}]")
        ]

    def client_config(self) -> dict[str, str]:
        """librdkafka's settings that log in as the super user ``admin`` (a ``Principal`` swaps in its own)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.username": ADMIN,
            "sasl.password": self.passwords[ADMIN],
            "ssl.ca.location": str(self.cert.ca),
        }

    def java_config(self) -> dict[str, str]:
        """The Java client's settings (``kafka.*`` options without the prefix) that log in as ``admin``."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.jaas.config": self.jaas("scram.ScramLoginModule", username=ADMIN, password=self.passwords[ADMIN]),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.cert.ca),
        }


class Principal:
    """A SCRAM principal of a secured broker: ``client_config`` (librdkafka's settings, ``bootstrap.servers``
    too), ``kafka_options`` (a kafka-eos source's or sink's ``kafka.*`` options) and ``properties`` (a Java
    client properties file) log in as it: the broker's admin settings (TLS trust) with its own credentials."""

    def __init__(self, name: str, password: str, broker: Any) -> None:
        self.name, self.password, self.broker = name, password, broker

    def client_config(self) -> dict[str, str]:
        return {
            "bootstrap.servers": self.broker.bootstrap,
            **self.broker.client_config(),
            "sasl.mechanism": MECHANISM,
            "sasl.username": self.name,
            "sasl.password": self.password,
        }

    def java_config(self) -> dict[str, str]:
        """The Java client's settings (``kafka.*`` options without the prefix) that log in as this principal."""
        jaas = Secured.jaas("scram.ScramLoginModule", username=self.name, password=self.password)
        return {**self.broker.java_config(), "sasl.mechanism": MECHANISM, "sasl.jaas.config": jaas}

    def kafka_options(self) -> dict[str, str]:
        return {
            "kafka.bootstrap.servers": self.broker.bootstrap,
            **{f"kafka.{k}": v for k, v in self.java_config().items()},
        }

    def properties(self, path: Path) -> Path:
        """A Java client properties file (mode 0600) that logs in as this principal (``--kafka-config``)."""
        import os

        from eos_core.kafka_config import render_properties

        path.write_text(render_properties(self.java_config(), f"spark-eos: principal {self.name}"))
        os.chmod(path, 0o600)
        return path

    def __repr__(self) -> str:
        return f"Principal(User:{self.name} on {self.broker.bootstrap})"  # never the password


def binding(name: str, acl: KafkaAcl, kind: Any = None) -> Any:
    """``acl`` of ``User:<name>`` as an AclBinding (or ``kind``: an AclBindingFilter matching it)."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    resource = {
        "topic": ResourceType.TOPIC,
        "group": ResourceType.GROUP,
        "transactional_id": ResourceType.TRANSACTIONAL_ID,
        "cluster": ResourceType.BROKER,
    }[acl.resource]
    return (kind or AclBinding)(
        resource,
        "kafka-cluster" if acl.resource == "cluster" else acl.name,
        ResourcePatternType.PREFIXED if acl.prefixed else ResourcePatternType.LITERAL,
        f"User:{name}",
        "*",
        getattr(AclOperation, acl.operation),
        AclPermissionType.ALLOW,
    )
