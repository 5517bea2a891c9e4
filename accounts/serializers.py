from __future__ import annotations

from typing import Any

from rest_framework import serializers


class LogInSerializer(serializers.Serializer[Any]):
    username = serializers.CharField(max_length=150, trim_whitespace=False)
    password = serializers.CharField(max_length=4096, trim_whitespace=False, style={"input_type": "password"})


class IssuedTokenSerializer(serializers.Serializer[Any]):
    token = serializers.CharField(help_text="Send as `Authorization: Token <token>`. Shown once; stored only hashed.")
    expiry = serializers.DateTimeField(allow_null=True, help_text="When the token stops working.")
