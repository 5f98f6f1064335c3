"""The events-queue consumer receives a message hidden only briefly and hides it for the handler's
whole visibility timeout just before the handler runs, so a consumer that dies during a long poll
(its node's agent killed) does not hold a spot warning back for the full timeout. moto SQS in
server mode."""

from __future__ import annotations

import pytest
from botocore.exceptions import EndpointConnectionError

from gpucloud.agent.events_queue import EventsQueueConsumer
from gpucloud.errors import UserError
from signals import eventbridge_samples as s

from .test_events_queue import Recorder, make_queues, poll_until


class DiesAfterReceive:
    """SQS handed the messages over, then the consumer's connection (its process) was gone."""

    def __init__(self, sqs) -> None:
        self.sqs = sqs

    def receive_message(self, **request):
        self.sqs.receive_message(**request)
        raise EndpointConnectionError(endpoint_url="http://sqs")


class Calls:
    """The real client, with a log of the calls the consumer made (in order)."""

    def __init__(self, sqs, log: list[str]) -> None:
        self.sqs, self.log = sqs, log

    def __getattr__(self, name):
        method = getattr(self.sqs, name)

        def call(**request):
            self.log.append(f"{name} {request.get('VisibilityTimeout', '')}".strip())
            return method(**request)

        return call


def test_a_message_taken_by_a_consumer_that_died_comes_back_within_the_receive_visibility(sqs):
    queue, _ = make_queues(sqs, max_receives=5)
    sqs.send_message(QueueUrl=queue, MessageBody=s.body(s.spot_warning()))
    dead = EventsQueueConsumer(
        DiesAfterReceive(sqs),
        queue,
        on_notice=Recorder(),
        wait_seconds=1,
        visibility_timeout=150,
        receive_visibility=1,
        clock=s.read_soon_after,
    )
    with pytest.raises(EndpointConnectionError):
        dead.poll_once()
    handler = Recorder()
    alive = EventsQueueConsumer(
        sqs,
        queue,
        on_notice=handler,
        wait_seconds=1,
        visibility_timeout=150,
        receive_visibility=1,
        clock=s.read_soon_after,
    )
    # Back after about the 1 s receive visibility, not after the 150 s the handler gets.
    poll_until(alive, lambda results: bool(handler.calls), timeout=15)
    assert [n.kind for n in handler.calls] == ["spot-interruption"]


def test_the_message_is_hidden_for_the_whole_visibility_timeout_before_its_handler_runs(sqs):
    queue, _ = make_queues(sqs)
    sqs.send_message(QueueUrl=queue, MessageBody=s.body(s.terminate_action()))
    calls: list[str] = []
    consumer = EventsQueueConsumer(
        Calls(sqs, calls),
        queue,
        on_notice=lambda n: calls.append("handler"),
        wait_seconds=1,
        visibility_timeout=150,
        receive_visibility=7,
        clock=s.read_soon_after,
    )
    result = consumer.poll_once()
    assert len(result.handled) == 1
    assert calls == ["receive_message 7", "change_message_visibility 150", "handler", "delete_message"]


def test_skips_are_not_hidden_first(sqs):
    queue, _ = make_queues(sqs)
    sqs.send_message(QueueUrl=queue, MessageBody=s.body(s.hook_test_notification()))
    calls: list[str] = []
    consumer = EventsQueueConsumer(
        Calls(sqs, calls), queue, on_notice=lambda n: None, wait_seconds=1, visibility_timeout=150, receive_visibility=7
    )
    assert len(consumer.poll_once().skipped) == 1
    assert calls == ["receive_message 7", "delete_message"]


def test_a_bad_receive_visibility_is_refused_with_one_line(sqs):
    with pytest.raises(UserError, match="receive_visibility 0 is outside 1 to 43200"):
        EventsQueueConsumer(sqs, "https://sqs.us-east-1.amazonaws.com/1/e", on_notice=print, receive_visibility=0)
