"""Smoke check of a running LocalStack: one call path per AWS service Baton uses, one line
per service, exit 1 on any failure.

    eval "$(tests/localstack/localstack.sh start)"
    target/localstack/venv/bin/python tests/localstack/probe.py

Uses boto3 from LocalStack's own virtualenv and AWS_ENDPOINT_URL from the environment.
Names carry a random suffix so that it can run again against the same LocalStack.
"""

import json
import os
import sys
import time
import traceback
import urllib.error
import urllib.request
import uuid

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError

ENDPOINT = os.environ.get("AWS_ENDPOINT_URL", "http://127.0.0.1:4566")
REGION = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
ACCOUNT = "000000000000"
RUN = uuid.uuid4().hex[:8]


def client(service, **config):
    return boto3.client(
        service,
        endpoint_url=ENDPOINT,
        region_name=REGION,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}, **config),
    )


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def dynamodb():
    ddb = client("dynamodb")
    table = f"probe-{RUN}"
    ddb.create_table(
        TableName=table,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk", "gpk", "gsk")
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "gsi1",
                "KeySchema": [
                    {"AttributeName": "gpk", "KeyType": "HASH"},
                    {"AttributeName": "gsk", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )
    ddb.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    try:
        item = {"pk": {"S": "run#1"}, "sk": {"S": "meta"}, "gpk": {"S": "status#parked"}, "gsk": {"S": "t1"}}
        ddb.put_item(TableName=table, Item=item)
        # The first action's condition fails (the item exists); the second's holds. AWS
        # cancels both and gives one reason per action, "None" for the one that was fine.
        try:
            ddb.transact_write_items(
                TransactItems=[
                    {
                        "Put": {
                            "TableName": table,
                            "Item": item,
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                    {
                        "Put": {
                            "TableName": table,
                            "Item": {"pk": {"S": "run#2"}, "sk": {"S": "meta"}},
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                ]
            )
            raise AssertionError("TransactWriteItems with a failing condition succeeded")
        except ClientError as e:
            check(e.response["Error"]["Code"] == "TransactionCanceledException", f"got {e.response['Error']}")
            reasons = [r.get("Code") for r in e.response.get("CancellationReasons", [])]
            check(reasons == ["ConditionalCheckFailed", "None"], f"cancellation reasons {reasons}")
        check("Item" not in ddb.get_item(TableName=table, Key={"pk": {"S": "run#2"}, "sk": {"S": "meta"}}),
              "the cancelled transaction wrote its second item")
        found = ddb.query(
            TableName=table,
            IndexName="gsi1",
            KeyConditionExpression="gpk = :g",
            ExpressionAttributeValues={":g": {"S": "status#parked"}},
        )["Items"]
        check([i["pk"]["S"] for i in found] == ["run#1"], f"GSI query returned {found}")
    finally:
        ddb.delete_table(TableName=table)
    return f"table with GSI, TransactWriteItems cancelled with reasons {reasons}, GSI query ok"


def sqs():
    q = client("sqs")
    url = q.create_queue(
        QueueName=f"probe-{RUN}.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    try:
        for body in ("first", "second", "second"):  # the repeat is deduplicated
            q.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="run-1")
        got = []

        def receive(wait):
            msgs = q.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait).get("Messages", [])
            for m in msgs:
                got.append(m["Body"])
                q.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])

        deadline = time.time() + 10
        while len(got) < 2 and time.time() < deadline:
            receive(1)
        receive(1)  # a duplicate would show here
        check(got == ["first", "second"], f"received {got}")
    finally:
        q.delete_queue(QueueUrl=url)
    return f"FIFO queue in order, deduplicated; queue URL {url}"


def events():
    eb, q = client("events"), client("sqs")
    bus = f"probe-{RUN}"
    url = q.create_queue(QueueName=f"probe-events-{RUN}")["QueueUrl"]
    arn = q.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    eb.create_event_bus(Name=bus)
    try:
        eb.put_rule(Name="to-sqs", EventBusName=bus, EventPattern=json.dumps({"source": ["baton.probe"]}))
        eb.put_targets(Rule="to-sqs", EventBusName=bus, Targets=[{"Id": "q", "Arn": arn}])
        out = eb.put_events(Entries=[
            {"EventBusName": bus, "Source": "baton.probe", "DetailType": "run", "Detail": json.dumps({"n": 1})},
            {"EventBusName": bus, "Source": "other", "DetailType": "run", "Detail": json.dumps({"n": 2})},
        ])
        check(out["FailedEntryCount"] == 0, f"put_events {out}")
        got = []
        deadline = time.time() + 10
        while time.time() < deadline and not got:
            for m in q.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", []):
                got.append(json.loads(m["Body"]))
        # A second look, for an unmatched event that would arrive late.
        for m in q.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", []):
            got.append(json.loads(m["Body"]))
        check([g.get("detail") for g in got] == [{"n": 1}], f"queue received {got}")
    finally:
        eb.remove_targets(Rule="to-sqs", EventBusName=bus, Ids=["q"])
        eb.delete_rule(Name="to-sqs", EventBusName=bus)
        eb.delete_event_bus(Name=bus)
        q.delete_queue(QueueUrl=url)
    return "custom bus, rule with SQS target: only the matching event arrived"


def s3():
    bucket = f"probe-{RUN}"
    s3p = client("s3", s3={"addressing_style": "path"})
    s3p.create_bucket(Bucket=bucket)
    try:
        s3p.put_object(Bucket=bucket, Key="a/b.json", Body=b'{"ok":true}')
        check(s3p.get_object(Bucket=bucket, Key="a/b.json")["Body"].read() == b'{"ok":true}', "path-style get")

        # Virtual-host style: what URL does an SDK asked for it build against this endpoint?
        # (The SDKs' S3 endpoint rules fall back to path style when the endpoint's host is an
        # IP address; a host name gets the bucket prepended, which needs DNS.)
        urls = []
        s3v = client("s3", s3={"addressing_style": "virtual"})
        s3v.meta.events.register("before-send.s3.GetObject", lambda request, **_: urls.append(request.url))
        try:
            s3v.get_object(Bucket=bucket, Key="a/b.json")["Body"].read()
            virtual_sdk = f"SDK asked for virtual style against {ENDPOINT} sent {urls[0]}: ok"
        except EndpointConnectionError:
            virtual_sdk = f"SDK asked for virtual style against {ENDPOINT} sent {urls[0]}: cannot connect"

        # LocalStack itself serves virtual-host requests by Host header.
        port = ENDPOINT.rsplit(":", 1)[1].strip("/")
        req = urllib.request.Request(
            f"{ENDPOINT}/a/b.json", headers={"Host": f"{bucket}.s3.localhost.localstack.cloud:{port}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                served = r.read() == b'{"ok":true}'
        except urllib.error.HTTPError as e:
            served = f"HTTP {e.code}"
        virtual_server = f"Host: {bucket}.s3.localhost.localstack.cloud -> {'ok' if served is True else served}"
        s3p.delete_object(Bucket=bucket, Key="a/b.json")
    finally:
        s3p.delete_bucket(Bucket=bucket)
    return f"path style put/get ok; {virtual_sdk}; {virtual_server}"


def secretsmanager():
    sm = client("secretsmanager")
    name = f"probe/{RUN}"
    arn = sm.create_secret(Name=name, SecretString='{"token":"t"}')["ARN"]
    try:
        check(sm.get_secret_value(SecretId=name)["SecretString"] == '{"token":"t"}', "secret value")
    finally:
        sm.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
    return "create/get ok"


def scheduler():
    sch, q = client("scheduler"), client("sqs")
    url = q.create_queue(QueueName=f"probe-sched-{RUN}")["QueueUrl"]
    arn = q.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    name = f"probe-{RUN}"
    try:
        sch.create_schedule(
            Name=name,
            ScheduleExpression="at(2030-01-01T00:00:00)",
            FlexibleTimeWindow={"Mode": "OFF"},
            ActionAfterCompletion="DELETE",
            Target={"Arn": arn, "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/scheduler", "Input": '{"wake":1}'},
        )
        got = sch.get_schedule(Name=name)
        check(got["ScheduleExpression"] == "at(2030-01-01T00:00:00)", f"get_schedule {got}")
        sch.delete_schedule(Name=name)
    finally:
        q.delete_queue(QueueUrl=url)
    return "create/get/delete of an at() schedule ok (LocalStack never fires schedules)"


def ses():
    mail = client("ses")
    sender = f"probe-{RUN}@example.com"
    mail.verify_email_identity(EmailAddress=sender)
    sent = mail.send_email(
        Source=sender,
        Destination={"ToAddresses": [f"probe-{RUN}@example.org"]},
        Message={"Subject": {"Data": f"probe {RUN}"}, "Body": {"Text": {"Data": "hello"}}},
    )["MessageId"]
    # LocalStack keeps what it "sent" where a test reads it back.
    url = os.environ["AWS_ENDPOINT_URL"] + "/_aws/ses"
    with urllib.request.urlopen(url) as r:
        messages = json.load(r)["messages"]
    check(any(m["Id"] == sent for m in messages), f"message {sent} in /_aws/ses")
    return "verify/send ok, read back from /_aws/ses"


def sts():
    who = client("sts").get_caller_identity()
    check(who["Account"] == ACCOUNT, f"caller identity {who}")
    return f"caller identity {who['Arn']}"


def main():
    failed = 0
    probes = (dynamodb, sqs, events, s3, secretsmanager, scheduler, ses, sts)
    for probe in probes:
        started = time.time()
        try:
            note = probe()
            print(f"ok   {probe.__name__}: {note} ({time.time() - started:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the next probe runs
            failed += 1
            print(f"FAIL {probe.__name__}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(file=sys.stderr)
    print(f"{len(probes) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
