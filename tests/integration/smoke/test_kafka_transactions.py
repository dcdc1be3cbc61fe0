"""The broker honours the transaction semantics onceflow relies on (real Kafka, KRaft)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

pytestmark = pytest.mark.integration


def _producer(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "transaction.timeout.ms": 60000}
    )
    producer.init_transactions(30)
    return producer


def _read_all(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    """Everything a consumer with the given isolation level sees, read up to its end of partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"smoke-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    try:
        while True:
            msg = consumer.poll(10)
            assert msg is not None, "no end-of-partition within 10 s"
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                return values
            values.append(msg.value())
    finally:
        consumer.close()


def test_read_committed_sees_committed_never_aborted(settings, make_topic) -> None:
    topic = make_topic("smoke-txn")
    producer = _producer(settings.kafka_bootstrap, f"smoke-{uuid.uuid4().hex}")

    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=f"committed-{i}".encode())
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=f"aborted-{i}".encode())
    producer.flush(30)  # the aborted records really reach the log before the abort
    producer.abort_transaction(30)

    producer.begin_transaction()
    producer.produce(topic, value=b"committed-3")
    producer.commit_transaction(30)

    committed = _read_all(settings.kafka_bootstrap, topic, "read_committed")
    uncommitted = _read_all(settings.kafka_bootstrap, topic, "read_uncommitted")

    assert committed == [b"committed-0", b"committed-1", b"committed-2", b"committed-3"]
    # The aborted batch is in the log (a read_uncommitted consumer sees it) but hidden from read_committed.
    assert [v for v in uncommitted if v.startswith(b"aborted")] == [b"aborted-0", b"aborted-1", b"aborted-2"]


def test_second_producer_with_same_transactional_id_fences_the_first(settings, make_topic) -> None:
    topic = make_topic("smoke-fence")
    txn_id = f"smoke-fence-{uuid.uuid4().hex}"
    zombie = _producer(settings.kafka_bootstrap, txn_id)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"from-zombie")
    zombie.flush(30)

    successor = _producer(settings.kafka_bootstrap, txn_id)  # bumps the epoch, aborts the zombie's txn
    successor.begin_transaction()
    successor.produce(topic, value=b"from-successor")
    successor.commit_transaction(30)

    with pytest.raises(KafkaException) as fenced:
        zombie.produce(topic, value=b"late-zombie-write")
        zombie.commit_transaction(30)
    error = fenced.value.args[0]
    assert error.fatal() or error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ), error

    assert _read_all(settings.kafka_bootstrap, topic, "read_committed") == [b"from-successor"]
