"""What every reader of the policy file shares: its error, and the language codes it may name."""

from __future__ import annotations


class PolicyError(ValueError):
    """The policy file is missing or malformed. Callers must treat it as "not allowed"."""


# Languages the policy may give translations for (ISO 639-1); others are a PolicyError, so a
# typo cannot silently create an unused list.
LANGUAGES = {
    "ar", "bg", "cs", "da", "de", "el", "en", "es", "fa", "fi", "fr", "he", "hi", "hu", "id", "it",
    "ja", "ko", "nl", "no", "pl", "pt", "ro", "ru", "sv", "th", "tr", "uk", "vi", "zh",
}
