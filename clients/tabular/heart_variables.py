"""The 13 clinical variables of UCI Heart Disease, the standard columns of a ``tabular-cls`` site.

Order and meaning as in the UCI ``processed.*.data`` files (Detrano et al., Am J
Cardiol 1989; ``heart-disease.names``) and in
``../shared/data/tabular/heart_disease/heart_disease_4sites.npz``. A horizontal
``tabular-cls`` federation trains one network for all sites, built by the
server before any data is seen, on exactly these columns in this order
(:meth:`clients.tabular.task.TabularClsTask.model_for`); the shared set
``heart-disease`` and the synthetic tabular hospitals write them.
"""

from __future__ import annotations

__all__ = ["HEART_FEATURES", "HEART_MEANINGS"]

#: Column -> what it holds (units, codes).
HEART_MEANINGS: dict[str, str] = {
    "age": "age in years",
    "sex": "1 = male, 0 = female",
    "cp": "chest pain type: 1 typical angina, 2 atypical angina, 3 non-anginal pain, 4 asymptomatic",
    "trestbps": "resting blood pressure (mm Hg, on admission)",
    "chol": "serum cholesterol (mg/dl)",
    "fbs": "fasting blood sugar > 120 mg/dl (1 = true)",
    "restecg": "resting ECG: 0 normal, 1 ST-T wave abnormality, 2 left ventricular hypertrophy",
    "thalach": "maximum heart rate achieved (exercise test)",
    "exang": "exercise-induced angina (1 = yes)",
    "oldpeak": "ST depression induced by exercise relative to rest (mm)",
    "slope": "slope of the peak exercise ST segment: 1 up, 2 flat, 3 down",
    "ca": "number of major vessels (0-3) coloured by fluoroscopy",
    "thal": "thallium scan: 3 normal, 6 fixed defect, 7 reversible defect",
}
#: The standard columns, in order.
HEART_FEATURES: tuple[str, ...] = tuple(HEART_MEANINGS)
