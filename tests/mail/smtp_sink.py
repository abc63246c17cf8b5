"""An SMTP server on loopback for the tests, built on aiosmtpd (PyPI): it prints its port as
a first JSON line, then each message it takes as one JSON line, decoded as a mail reader
would (its sender, recipients, subject, plain text and `X-Baton-Delivery` header)."""

import asyncio
import email
import email.policy
import json

from aiosmtpd.smtp import SMTP


class Sink:
    async def handle_DATA(self, server, session, envelope):
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        body = msg.get_body(preferencelist=("plain",))
        print(json.dumps({
            "from": envelope.mail_from,
            "to": envelope.rcpt_tos,
            "subject": str(msg["Subject"]),
            "text": body.get_content() if body else "",
            "delivery": msg["X-Baton-Delivery"],
        }), flush=True)
        return "250 Message accepted for delivery"


async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(Sink()), "127.0.0.1", 0)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
