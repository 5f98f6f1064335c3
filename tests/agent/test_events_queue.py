"""The events-queue consumer against moto SQS in server mode: ack after the action, redelivery
when the handler fails, the dead-letter queue after max receives, the instance filter."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest

from gpucloud.agent.events_queue import EventsQueueConsumer, PollResult
from gpucloud.errors import UserError
from gpucloud.signals.events import Notice
from signals import eventbridge_samples as s


def make_queues(sqs, *, max_receives: int = 2) -> tuple[str, str]:
    dlq = sqs.create_queue(QueueName="events-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    queue = sqs.create_queue(
        QueueName="events",
        Attributes={
            "VisibilityTimeout": "60",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receives)}),
        },
    )["QueueUrl"]
    return queue, dlq


def depth(sqs, url: str) -> int:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def poll_until(
    consumer: EventsQueueConsumer, done: Callable[[list[PollResult]], bool], timeout: float = 15
) -> list[PollResult]:
    """Poll (each poll long-polls up to wait_seconds) until ``done`` holds, or fail at the deadline."""
    results: list[PollResult] = []
    deadline = time.monotonic() + timeout
    while not done(results):
        assert time.monotonic() < deadline, f"condition not met after {timeout}s: {results}"
        results.append(consumer.poll_once())
    return results


class Recorder:
    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: list[Notice] = []
        self.called = threading.Event()

    def __call__(self, notice: Notice) -> None:
        self.calls.append(notice)
        self.called.set()
        if len(self.calls) <= self.failures:
            raise RuntimeError("checkpoint upload failed")


def consumer(sqs, url: str, handler, **kwargs) -> EventsQueueConsumer:
    kwargs.setdefault("clock", s.read_soon_after)
    return EventsQueueConsumer(sqs, url, on_notice=handler, wait_seconds=1, visibility_timeout=1, **kwargs)


def test_notice_is_handled_then_deleted(sqs):
    queue, _ = make_queues(sqs)
    sqs.send_message(QueueUrl=queue, MessageBody=s.body(s.spot_warning()))
    handler = Recorder()
    result = consumer(sqs, queue, handler).poll_once()
    assert result.received == 1 and [n.kind for n in result.handled] == ["spot-interruption"]
    assert handler.calls[0].deadline == s.EVENT_EPOCH + 120 and handler.calls[0].source == "queue"
    assert depth(sqs, queue) == 0


def test_failed_handler_leaves_the_message_to_reappear(sqs):
    queue, _ = make_queues(sqs, max_receives=5)
    sqs.send_message(QueueUrl=queue, MessageBody=s.body(s.terminate_action()))
    handler = Recorder(failures=1)
    c = consumer(sqs, queue, handler)
    first = c.poll_once()
    assert (
        first.failed
        and "handler failed for asg-terminate on i-1234567890abcdef0: checkpoint upload failed" in first.failed[0]
    )
    assert depth(sqs, queue) == 1  # kept, invisible for the visibility timeout
    poll_until(c, lambda rs: any(r.handled for r in rs))
    assert len(handler.calls) == 2 and handler.calls[0].event_id == handler.calls[1].event_id
    assert depth(sqs, queue) == 0


@pytest.mark.parametrize(
    "body",
    ["{broken json", s.body(s.state_change() | {"detail-type": "AWS Health Event"})],
    ids=["malformed", "unknown-type"],
)
def test_unreadable_message_ends_in_the_dead_letter_queue_intact(sqs, body):
    queue, dlq = make_queues(sqs, max_receives=2)
    sqs.send_message(QueueUrl=queue, MessageBody=body)
    handler = Recorder()
    c = consumer(sqs, queue, handler)
    results = poll_until(c, lambda rs: depth(sqs, dlq) == 1)
    assert handler.calls == []
    assert sum(len(r.unreadable) for r in results) == 2  # one clear line per receive, no crash
    assert depth(sqs, queue) == 0
    moved = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=1)["Messages"]
    assert moved[0]["Body"] == body


def test_handler_failing_every_time_ends_in_the_dead_letter_queue(sqs):
    queue, dlq = make_queues(sqs, max_receives=2)
    sqs.send_message(QueueUrl=queue, MessageBody=s.body(s.spot_warning()))
    handler = Recorder(failures=10**6)
    poll_until(consumer(sqs, queue, handler), lambda rs: depth(sqs, dlq) == 1)
    assert len(handler.calls) == 2


def test_skips_are_deleted_without_calling_the_handler(sqs):
    queue, _ = make_queues(sqs)
    for data in (
        s.hook_test_notification(),
        s.state_change(),
        s.direct_lifecycle(transition="autoscaling:EC2_INSTANCE_LAUNCHING"),
    ):
        sqs.send_message(QueueUrl=queue, MessageBody=s.body(data))
    handler = Recorder()
    results = poll_until(consumer(sqs, queue, handler), lambda rs: sum(len(r.skipped) for r in rs) == 3)
    assert handler.calls == [] and depth(sqs, queue) == 0
    assert sum(r.received for r in results) == 3


def test_instance_filter_passes_other_instances_on(sqs):
    queue, _ = make_queues(sqs, max_receives=5)
    sqs.send_message(QueueUrl=queue, MessageBody=s.body(s.spot_warning(instance=s.INSTANCE)))
    sqs.send_message(QueueUrl=queue, MessageBody=s.body(s.rebalance(instance=s.OTHER_INSTANCE)))
    mine = Recorder()
    node = consumer(sqs, queue, mine, instance_ids={s.INSTANCE})
    poll_until(node, lambda rs: sum(len(r.handled) + len(r.passed_on) for r in rs) >= 2)
    assert [s_.payload["instance-id"] for s_ in mine.calls] == [s.INSTANCE]
    assert depth(sqs, queue) == 1  # released at once, not deleted
    fleet = Recorder()
    poll_until(consumer(sqs, queue, fleet), lambda rs: any(r.handled for r in rs))
    assert [(n.kind, n.payload["instance-id"]) for n in fleet.calls] == [("rebalance", s.OTHER_INSTANCE)]
    assert depth(sqs, queue) == 0


def test_sns_wrapped_lifecycle_message_is_handled(sqs):
    queue, _ = make_queues(sqs)
    sqs.send_message(QueueUrl=queue, MessageBody=s.body(s.sns_wrapped(s.direct_lifecycle())))
    handler = Recorder()
    poll_until(consumer(sqs, queue, handler), lambda rs: any(r.handled for r in rs))
    assert handler.calls[0].payload["LifecycleActionToken"] == s.TOKEN


def test_run_loop_delivers_until_stopped(sqs):
    queue, _ = make_queues(sqs)
    handler = Recorder()
    stop = threading.Event()
    thread = threading.Thread(target=consumer(sqs, queue, handler).run, args=(stop,), daemon=True)
    thread.start()
    sqs.send_message(QueueUrl=queue, MessageBody=s.body(s.spot_warning()))
    assert handler.called.wait(timeout=10), "the run loop never delivered the notice"
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive() and len(handler.calls) == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"queue_url": "events"}, "events queue URL 'events' is not a URL"),
        ({"wait_seconds": 21}, "wait_seconds 21 is outside 0 to 20"),
        ({"visibility_timeout": -1}, "visibility_timeout -1 is outside 0 to 43200"),
        ({"max_messages": 11}, "max_messages 11 is outside 1 to 10"),
        ({"instance_ids": ["node-1"]}, "instance id 'node-1' is not an EC2 instance id"),
    ],
)
def test_bad_settings_are_refused_with_one_line(kwargs, message):
    args = {"queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/events", **kwargs}
    with pytest.raises(UserError) as info:
        EventsQueueConsumer(object(), args.pop("queue_url"), on_notice=print, **args)
    assert message in str(info.value)


def test_a_poison_message_does_not_take_its_batch_with_it(sqs):
    """A body that broke the parser (a time in the year 10000 raised ValueError)
    made poll_once raise, so the genuine spot warning received in the same batch was never handled
    and went to the dead-letter queue after maxReceiveCount receives."""
    queue, dlq = make_queues(sqs, max_receives=5)
    poison = [
        s.body(s.spot_warning(time="9999-12-31T23:59:59-23:59")),
        s.body(s.sns_wrapped(s.direct_lifecycle() | {"Time": "9999-12-31T23:59:59-23:59"})),
        "[" * 100_000 + "]" * 100_000,
    ]
    for body in poison[:2]:
        sqs.send_message(QueueUrl=queue, MessageBody=body)
    sqs.send_message(QueueUrl=queue, MessageBody=s.body(s.spot_warning()))
    sqs.send_message(QueueUrl=queue, MessageBody=poison[2])
    handler = Recorder()
    c = EventsQueueConsumer(
        sqs, queue, on_notice=handler, wait_seconds=1, visibility_timeout=30, max_messages=10, clock=s.read_soon_after
    )
    results = poll_until(c, lambda rs: sum(r.received for r in rs) >= 4)
    assert [n.kind for n in handler.calls] == ["spot-interruption"]
    assert sum(len(r.handled) for r in results) == 1
    unreadable = [line for r in results for line in r.unreadable]
    assert len(unreadable) == 3 and all("\n" not in line for line in unreadable)
    assert depth(sqs, dlq) == 0  # the warning was deleted once handled; the poison waits for its receives
