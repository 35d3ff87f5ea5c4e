"""The errors of the local service: what it answers instead of a result, as moto's ``exceptions.py``.

Raised anywhere below the wire (``models``, ``faults``, ``responses``' validation) and
shaped by ``responses.error_response`` into botocore's error shape of the request's protocol.
"""
from __future__ import annotations


class ServiceError(Exception):
    """An error answered on the wire: an error code, an HTTP status and a message."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class NotFound(ServiceError):
    """Something named in the request does not exist. The two models name it differently:
    SageMaker's ``ResourceNotFound`` (HTTP 400), the runtime's ``ResourceNotFoundException``
    (HTTP 404); ``responses`` answers the one of the request's service."""

    def __init__(self, message: str) -> None:
        super().__init__("ResourceNotFound", message, 400)


def invalid(message: str) -> ServiceError:
    return ServiceError("ValidationException", message, 400)
