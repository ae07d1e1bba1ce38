"""The app layer: what `App` and `AsyncApp` share, whatever runtime carries them out.

Here: the listener registry and `AppBase` (`spec`), one registered listener
(`listener_spec`), the values `listener()` takes (`listener_values`) and its old
flat options (`listener_options`), binding a handler to deliveries (`handler`) and
one handler call (`invocation`), an app's connection and shutdown settings
(`settings`), what a runtime declares for its listeners (`declaring`), and the
AsyncAPI document of an app's listeners (`asyncapi`).

Not here: decisions (`ackkit._core`), anything that does I/O or imports a client
library (`ackkit._sync`, `ackkit._async`), the message a handler receives or
publishes (`ackkit._messages`), talking to a broker (`ackkit._connection`), log
lines and observers (`ackkit._telemetry`).
"""
