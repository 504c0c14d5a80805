"""A request message that does not decode is INVALID_ARGUMENT, not UNKNOWN.

grpc hands a request's bytes to the message's parser before any handler runs; a corrupt message, or a string
field holding invalid UTF-8, makes that parser raise, and grpc answers UNKNOWN with the parser's exception.
``DecodeErrorInterceptor`` wraps each handler's parser so such a request reaches the handler as an
``Undecodable`` marker, which the wrapped handler turns into INVALID_ARGUMENT naming the message it should have
been. Unary and streaming handlers alike; a stream stops at its first bad message.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc


@dataclass(frozen=True)
class Undecodable:
    message: str


def _safe(parse: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    def parse_or_mark(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # the parser's own errors (DecodeError, invalid UTF-8): the caller's fault
            return Undecodable(f"request: not a valid message for {method} ({type(exc).__name__}: {exc})")
    return parse_or_mark


async def _check(request: Any, context: grpc.aio.ServicerContext) -> Any:
    if isinstance(request, Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
    return request


async def _checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    async for request in requests:
        yield await _check(request, context)


class DecodeErrorInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        parse = _safe(handler.request_deserializer, method.lstrip("/"))
        out = handler.response_serializer
        if handler.unary_unary is not None and inspect.iscoroutinefunction(handler.unary_unary):
            behavior = handler.unary_unary

            async def unary_unary(request, context):
                return await behavior(await _check(request, context), context)
            return grpc.unary_unary_rpc_method_handler(unary_unary, request_deserializer=parse,
                                                       response_serializer=out)
        if handler.unary_stream is not None and inspect.isasyncgenfunction(handler.unary_stream):
            behavior = handler.unary_stream

            async def unary_stream(request, context):
                async for response in behavior(await _check(request, context), context):
                    yield response
            return grpc.unary_stream_rpc_method_handler(unary_stream, request_deserializer=parse,
                                                        response_serializer=out)
        if handler.stream_stream is not None and inspect.isasyncgenfunction(handler.stream_stream):
            behavior = handler.stream_stream

            async def stream_stream(requests, context):
                async for response in behavior(_checked(requests, context), context):
                    yield response
            return grpc.stream_stream_rpc_method_handler(stream_stream, request_deserializer=parse,
                                                         response_serializer=out)
        return handler
