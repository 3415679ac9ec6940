#!/usr/bin/env python3
"""The two SMTP ends of `make mail-test` (scripts/mail-test), both on loopback in its network namespace.

  mail-smtp.py relay PORT DIR     a fake Apple relay: accepts every message and writes it to DIR, but
                                  answers RCPT TO as Apple's relay does an unregistered sender for a
                                  local part starting `unauth.` (`550 5.1.1 <sender>: unauthorized
                                  sender`) and a dead relay address for one starting `dead.` (`550 5.1.1
                                  user not found`)
  mail-smtp.py send PORT ADDRESS  sends one message to ADDRESS through Postfix with smtplib and prints
                                  the RCPT answer: `250` when accepted (the message is then sent), else
                                  `CODE TEXT` (the refusal Postfix gave at RCPT TO)
"""
import os
import smtplib
import socketserver
import sys
import uuid


class Relay(socketserver.StreamRequestHandler):
    """Just enough of RFC 5321's server side for Postfix's smtp client: one message per transaction."""

    def reply(self, line):
        self.wfile.write(line.encode() + b"\r\n")

    def handle(self):
        self.reply("220 relay.siwa.invalid ESMTP fake Apple relay")
        recipients = []
        sender = ""
        while line := self.rfile.readline():
            verb = line.decode("latin-1").strip().split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                self.reply("250 relay.siwa.invalid")
            elif verb == "MAIL":
                recipients = []
                sender = line.decode("latin-1").strip().split(":", 1)[1].split()[0].strip("<>")
                self.reply("250 2.1.0 ok")
            elif verb == "RCPT":
                recipient = line.decode("latin-1").strip().split(":", 1)[1].split()[0].strip("<>")
                if recipient.startswith("unauth."):
                    self.reply(f"550 5.1.1 <{sender}>: unauthorized sender")
                elif recipient.startswith("dead."):
                    self.reply("550 5.1.1 user not found")
                else:
                    recipients.append(recipient)
                    self.reply("250 2.1.5 ok")
            elif verb == "DATA":
                self.reply("354 go on")
                body = []
                while (chunk := self.rfile.readline()) not in (b".\r\n", b".\n", b""):
                    body.append(chunk)
                name = os.path.join(self.server.directory, uuid.uuid4().hex)
                with open(name + ".tmp", "wb") as out:
                    out.write(("X-Relay-Recipients: " + ",".join(recipients) + "\r\n").encode())
                    out.writelines(body)
                os.rename(name + ".tmp", name + ".eml")  # whole messages only
                self.reply("250 2.0.0 queued")
            elif verb == "QUIT":
                self.reply("221 2.0.0 bye")
                return
            else:
                self.reply("250 ok")


def relay(port, directory):
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    with socketserver.ThreadingTCPServer(("127.0.0.1", int(port)), Relay) as server:
        server.directory = directory
        server.serve_forever()


def send(port, address):
    with smtplib.SMTP("127.0.0.1", int(port), timeout=30) as client:
        client.ehlo("app.siwa.invalid")
        client.mail("news@app.siwa.invalid")
        code, text = client.rcpt(address)
        if code != 250:
            print(code, text.decode())
            return
        client.data(f"From: news@app.siwa.invalid\r\nTo: {address}\r\nSubject: mail test\r\n\r\nhello\r\n")
        print(250)


if __name__ == "__main__":
    {"relay": relay, "send": send}[sys.argv[1]](*sys.argv[2:])
