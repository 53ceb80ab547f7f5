"""The policy's ``languages`` section: the languages the prompt gate can read, and what happens to
a prompt in any other.

```json
"languages": {
  "declared": ["en", "es", ...],   // languages with word lists, contexts and measured recall
  "undeclared": "review"           // "review" (default: fail closed), "block", or "allow"
}
```

``review`` holds the prompt for a moderator, ``block`` refuses it with a reason that names the
language and the supported ones, ``allow`` (an operator's explicit choice) lets the other checks
decide alone. A declared language must have words in the policy (a translation in some category;
English is the policy's own language), so a language cannot be declared readable without a word
list. A policy without the section declares English and every language it has translations for,
with ``review``.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .policy_base import PolicySpec, validate

ACTIONS = ("review", "block", "allow")

# Names for reasons (py3langid's codes; ISO 639-1 where there is one).
NAMES = {
    "af": "Afrikaans", "am": "Amharic", "ar": "Arabic", "az": "Azerbaijani", "be": "Belarusian",
    "bg": "Bulgarian", "bn": "Bengali", "bs": "Bosnian", "ca": "Catalan", "cs": "Czech", "cy": "Welsh",
    "da": "Danish", "de": "German", "el": "Greek", "en": "English", "eo": "Esperanto", "es": "Spanish",
    "et": "Estonian", "eu": "Basque", "fa": "Persian", "fi": "Finnish", "fr": "French", "ga": "Irish",
    "gl": "Galician", "gu": "Gujarati", "ha": "Hausa", "he": "Hebrew", "hi": "Hindi", "hr": "Croatian",
    "ht": "Haitian Creole", "hu": "Hungarian", "hy": "Armenian", "id": "Indonesian", "ig": "Igbo",
    "is": "Icelandic", "it": "Italian", "ja": "Japanese", "jv": "Javanese", "ka": "Georgian",
    "kk": "Kazakh", "km": "Khmer", "kn": "Kannada", "ko": "Korean", "ku": "Kurdish", "ky": "Kyrgyz",
    "la": "Latin", "lb": "Luxembourgish", "lo": "Lao", "lt": "Lithuanian", "lv": "Latvian",
    "mg": "Malagasy", "mk": "Macedonian", "ml": "Malayalam", "mn": "Mongolian", "mr": "Marathi",
    "ms": "Malay", "mt": "Maltese", "my": "Burmese", "ne": "Nepali", "nl": "Dutch", "no": "Norwegian",
    "om": "Oromo", "or": "Odia", "pa": "Punjabi", "pl": "Polish", "ps": "Pashto", "pt": "Portuguese",
    "qu": "Quechua", "ro": "Romanian", "ru": "Russian", "rw": "Kinyarwanda", "si": "Sinhala",
    "sk": "Slovak", "sl": "Slovenian", "so": "Somali", "sq": "Albanian", "sr": "Serbian",
    "sv": "Swedish", "sw": "Swahili", "ta": "Tamil", "te": "Telugu", "tg": "Tajik", "th": "Thai",
    "tl": "Tagalog", "tr": "Turkish", "ug": "Uyghur", "uk": "Ukrainian", "ur": "Urdu", "uz": "Uzbek",
    "vi": "Vietnamese", "xh": "Xhosa", "yo": "Yoruba", "zh": "Chinese", "zu": "Zulu", "und": "an undetermined language",
}


def name(code: str) -> str:
    return NAMES.get(code, code)


@dataclass(frozen=True)
class LanguagePolicy:
    declared: frozenset[str]
    undeclared: str = "review"

    @classmethod
    def default(cls, translations: Iterable[dict[str, list[str]]]) -> LanguagePolicy:
        langs = {"en"}
        for t in translations:
            langs.update(t)
        return cls(frozenset(langs))

    def supported(self) -> str:
        return ", ".join(f"{name(c)} ({c})" for c in sorted(self.declared, key=lambda c: (c != "en", name(c))))

    def reason(self, found: tuple[str, ...], action: str) -> str:
        what = " and ".join(f"{name(c)} ({c})" for c in found) or "a language it cannot identify"
        if action == "block":
            tail = "so it is not accepted"
        else:
            tail = "so it is held until a moderator has checked it"
        return (f"The prompt is written in {what}, which this service's safety check cannot read, {tail}. "
                f"Supported languages: {self.supported()}.")


def parse_languages(data: dict, categories, source: str = "<policy>") -> LanguagePolicy:
    """The ``languages`` section (see the module docstring), validated with the rest of the file
    by safety/policy_base.PolicySpec; PolicyError on a problem."""
    with_words = {"en"}
    for c in categories:
        with_words.update(lang for lang, terms in c.translations.items() if terms)
    if data.get("languages") is None:
        return LanguagePolicy(frozenset(with_words))
    spec = validate(PolicySpec, data, source).languages
    return LanguagePolicy(frozenset(spec.declared), spec.undeclared)
