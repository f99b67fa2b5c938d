"""Headless Chromium driven through the DevTools protocol, for tests that
need more than --dump-dom: a token in the page's local storage, script run
in the page, and every console message, exception and Content-Security-Policy
violation the page caused. The protocol runs over a pipe
(--remote-debugging-pipe: JSON messages ending in a NUL byte, Chromium
reading fd 3 and writing fd 4), so it needs no WebSocket library."""
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time

CHROMIUM = shutil.which("chromium")

# Runs before the page's own script in every document: CSP violations as the
# page itself sees them (the securitypolicyviolation event), beside the
# console's report of them.
_WATCH_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) =>
  window.__cspViolations.push(
      `${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`));
"""


class Page:
    """One tab. `console` collects console messages, log entries (CSP
    violations among them) and uncaught exceptions as strings."""

    def __init__(self, timeout=60):
        self._timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="ballast-chromium-")
        to_chromium_r, self._to_chromium = os.pipe()
        self._from_chromium, from_chromium_w = os.pipe()

        def pipes_as_3_and_4():
            # Out of the way first: either pipe end may itself be fd 3 or 4.
            ends = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chromium_r, from_chromium_w)]
            for target, fd in zip((3, 4), ends):
                os.dup2(fd, target, inheritable=True)

        self._proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--remote-debugging-pipe",
             f"--user-data-dir={self._profile}", "--window-size=1400,1600", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=pipes_as_3_and_4)
        os.close(to_chromium_r)
        os.close(from_chromium_w)
        self._buffer = b""
        self._next_id = 0
        self._session = None
        self.console = []
        target = self._call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self._call("Target.attachToTarget", targetId=target,
                                   flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self._call(f"{domain}.enable")
        self._call("Page.addScriptToEvaluateOnNewDocument", source=_WATCH_VIOLATIONS)

    def close(self):
        self._proc.kill()
        self._proc.wait()
        os.close(self._to_chromium)
        os.close(self._from_chromium)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    # -- the protocol ---------------------------------------------------------
    def _call(self, method, **params):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self._session is not None:
            message["sessionId"] = self._session
        os.write(self._to_chromium, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self._timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply["result"]

    def _read(self, deadline):
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise AssertionError("Chromium did not answer in time")
            chunk = os.read(self._from_chromium, 1 << 20)
            if not chunk:
                raise AssertionError("Chromium exited")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        self._note(message)
        return message

    def _note(self, message):
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.console.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.console.append(
                f"exception: {details.get('exception', {}).get('description', details['text'])}")
        elif method == "Log.entryAdded":
            entry = params["entry"]
            self.console.append(f"{entry['source']} {entry['level']}: {entry['text']} "
                                f"{entry.get('url', '')}")

    # -- what tests use -------------------------------------------------------
    def goto(self, url, timeout=30):
        """Loads `url` (a fragment-only change too) and waits until it has."""
        self._call("Page.navigate", url=url)
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'",
                      timeout, url)

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page (awaited when a
        promise); exceptions fail the test."""
        result = self._call("Runtime.evaluate", expression=expression, returnByValue=True,
                            awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression, timeout, what):
        """Polls a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        error = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except AssertionError as e:  # the document changed under it: try again
                error = e
            else:
                if value:
                    return value
            time.sleep(0.1)
        try:
            text = self.evaluate(
                "location.href + '\\n' + document.documentElement.outerHTML.slice(0, 3000)")
        except AssertionError as e:
            text = str(e)
        raise AssertionError(f"timed out after {timeout} s waiting for {what} ({error}); "
                             f"console: {self.console}; the page: {text}")

    def violations(self):
        """CSP violations the page saw, and console lines that report one."""
        seen = self.evaluate("window.__cspViolations || []")
        return seen + [line for line in self.console if "Content Security Policy" in line]

    def screenshot(self, path):
        import base64
        data = self._call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
