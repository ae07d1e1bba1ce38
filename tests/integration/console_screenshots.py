"""The screenshots in docs/images (console-overview.png, console-group.png), from a
real service on a real broker:

    PYTHONPATH=. python tests/integration/console_screenshots.py

A broker node of the test kit's own; an App with two listeners failing four ways
for about 40 seconds (so the chart has a shape); the console; headless Chromium.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _console_support import served  # noqa: E402
from _retry_support import REPO, publish  # noqa: E402

from ackkit import App, Consumer, Delivery, Retry  # noqa: E402
from ackkit.console import Holder, Store  # noqa: E402
from ackkit.testing import provision_broker  # noqa: E402

IMAGES = REPO / "docs" / "images"


def main() -> None:
    from playwright.sync_api import sync_playwright

    rnd = random.Random(7)
    with provision_broker(exclusive=True) as broker:
        app = App(broker.url)
        retry = Retry(max_attempts=3, initial_interval=0.02)

        @app.listener("orders", retry=retry, consumer=Consumer(prefetch=50))
        def place_order(d: Delivery) -> None:
            o = json.loads(d.body)
            if o["sku"].startswith("old"):
                raise KeyError(o["sku"])
            if o["price"] < 0:
                raise ValueError(f"negative price {o['price']} for order {o['id']}")
            raise TimeoutError(f"inventory service timed out after {o['id'] % 900 + 100} ms")

        @app.listener("billing", retry=retry, consumer=Consumer(prefetch=50))
        def charge(d: Delivery) -> None:
            raise PermissionError(f"card {json.loads(d.body)['card']} declined by the bank")

        with app.running():
            n = 0
            for second in range(40):
                burst = 2 + (25 if 12 <= second < 16 else 0) + rnd.randrange(4)
                for _ in range(burst):
                    n += 1
                    kind = rnd.random()
                    if kind < 0.25:
                        body = {"card": f"4111-xxxx-{rnd.randrange(9999):04d}"}
                        publish(broker.url, "billing", json.dumps(body), message_id=f"pay-{n}")
                        continue
                    sku = f"old-{rnd.randrange(999)}" if kind < 0.5 else f"sku-{n}"
                    price = -rnd.randrange(1, 99) if 0.5 <= kind < 0.7 else 10
                    body = {"id": 1000 + n, "sku": sku, "price": price, "lines": [1, 2]}
                    publish(broker.url, "orders", json.dumps(body), message_id=f"order-{n}")
                time.sleep(1)
            time.sleep(3)
        dlqs = ["orders.dlq", "billing.dlq"]
        holder = Holder(broker.url, dlqs, Store(dlqs))
        holder.start()
        try:
            time.sleep(2)
            with served(holder) as base, sync_playwright() as p:
                b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
                page = b.new_page(viewport={"width": 1280, "height": 760})
                page.goto(base + "/")
                page.screenshot(path=str(IMAGES / "console-overview.png"), full_page=True)
                page.goto(base + "/groups")
                page.locator("tr.group-row", has_text="ValueError").locator("a").click()
                page.screenshot(path=str(IMAGES / "console-group.png"))
                b.close()
        finally:
            holder.stop()
    print(f"wrote {IMAGES}/console-overview.png and console-group.png ({n} messages)")


if __name__ == "__main__":
    main()
