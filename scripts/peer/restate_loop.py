"""The peer benchmark's workload on Restate: a durable loop of N steps, each a journaled
1 KB echo (`ctx.run`), as `baton bench` runs N iterations of a scripted agent whose every
iteration is one `echo` tool call with a 1 KB argument. Served by hypercorn; see
scripts/bench-restate.sh."""

import restate

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 "
PAYLOAD = 1024
MASK = (1 << 64) - 1


def payload(i: int) -> str:
    """A 1 KB string that differs per step and does not compress to nothing (the same
    generator as baton bench's)."""
    x = ((i * 0x9E3779B97F4A7C15) & MASK) | 1
    out = []
    while len(out) < PAYLOAD:
        x ^= (x << 13) & MASK
        x ^= x >> 7
        x ^= (x << 17) & MASK
        out.append(ALPHABET[x % len(ALPHABET)])
    return "".join(out)


loop = restate.Service("loop")


@loop.handler()
async def run(ctx: restate.Context, n: int) -> int:
    echoed = 0
    for i in range(n):
        arg = payload(i)

        def echo(arg: str = arg) -> str:
            return arg

        out = await ctx.run("echo", echo)
        echoed += len(out)
    return echoed


app = restate.app(services=[loop])
