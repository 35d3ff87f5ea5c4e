import socket

import pytest


def test_socket_guard_refuses_non_loopback():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(ConnectionRefusedError, match="loopback"):
            s.connect(("192.0.2.1", 80))
    finally:
        s.close()
