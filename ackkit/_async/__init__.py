"""The asyncio runtime on aio-pika (install with `pip install "ackkit[async]"`).

Modules are imported explicitly (`ackkit._async.app`, ...) so that
`ackkit._async.delivery` stays importable without aio-pika.
"""
