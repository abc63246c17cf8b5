"""A small MCP server for Baton's tests, on the MCP Python SDK's own FastMCP, served over
streamable HTTP at http://127.0.0.1:<port>/mcp.

usage: calc_server.py PORT
"""

import sys

from mcp.server.fastmcp import Context, FastMCP, Image
from pydantic import BaseModel

mcp = FastMCP("calc", host="127.0.0.1", port=int(sys.argv[1]))


@mcp.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool()
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    if b == 0:
        raise ValueError("division by zero")
    return a / b


class Stats(BaseModel):
    count: int
    mean: float


@mcp.tool()
def stats(values: list[float]) -> Stats:
    """Count and mean of a list of numbers (structured output)."""
    return Stats(count=len(values), mean=sum(values) / len(values) if values else 0.0)


@mcp.tool()
def whoami(ctx: Context) -> str:
    """The Authorization header the client sent."""
    request = ctx.request_context.request
    return request.headers.get("authorization", "(none)") if request else "(no request)"


@mcp.tool()
def charge(cents: int, ctx: Context) -> str:
    """Charge an amount: answers with the idempotency key the call came with (its `_meta`)."""
    meta = ctx.request_context.meta
    extra = (meta.model_extra or {}) if meta else {}
    return extra.get("io.baton/idempotencyKey", "(none)")


# The first bytes of a PNG file, then the tool's own: what the client keeps is checked.
CHART_PNG = b"\x89PNG\r\n\x1a\n" + b"baton-test-chart"


@mcp.tool()
def chart() -> Image:
    """A chart of the figures, as a PNG image."""
    return Image(data=CHART_PNG, format="png")


if __name__ == "__main__":
    mcp.run(transport="streamable-http")
